package console

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/lease"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Source is what the console reads: the coordinator's admin read API and
// its view of the leadership. *coordinator.Coordinator is one.
type Source interface {
	ListPolicies(context.Context, *pb.ListPoliciesRequest) (*pb.ListPoliciesResponse, error)
	ListLeases(context.Context, *pb.ListLeasesRequest) (*pb.ListLeasesResponse, error)
	GetBound(context.Context, *pb.GetBoundRequest) (*pb.GetBoundResponse, error)
	ListRegions(context.Context, *pb.ListRegionsRequest) (*pb.ListRegionsResponse, error)
	// IsLeader, Epoch and Leader say whether this replica leads, its
	// epoch, and the address of the replica it last saw leading.
	IsLeader() bool
	Epoch() int64
	Leader() string
	// Replica is this replica's name.
	Replica() string
}

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Console serves the pages and samples the history. Create it with New,
// run Run for the history, and serve it as an http.Handler.
type Console struct {
	src  Source
	cfg  Config
	tmpl *template.Template
	mux  *http.ServeMux

	mu   sync.Mutex
	hist *History
}

// New returns a console reading src.
func New(src Source, cfg Config) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(templateFiles, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	c := &Console{src: src, cfg: cfg, tmpl: tmpl, hist: NewHistory(cfg.Keep), mux: http.NewServeMux()}
	static, _ := fs.Sub(staticFiles, "static")
	c.mux.HandleFunc("GET /{$}", c.overview)
	c.mux.HandleFunc("GET /policy/{name}", c.policy)
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	return c, nil
}

// Run samples every quota's leases every Config.SampleEvery until ctx
// ends. A replica that does not lead has no leases to sample; its history
// stays as it was.
func (c *Console) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.SampleEvery)
	defer t.Stop()
	for {
		c.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample records the leases now, if this replica leads.
func (c *Console) Sample(ctx context.Context) {
	if !c.src.IsLeader() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SampleEvery)
	defer cancel()
	resp, err := c.src.ListLeases(ctx, &pb.ListLeasesRequest{})
	if err != nil {
		c.cfg.Logger.Debug("console sample skipped", "error", err)
		return
	}
	obs := make([]Observation, 0, len(resp.Leases))
	for _, l := range resp.Leases {
		obs = append(obs, Observation{
			Quota:  l.Quota,
			Region: l.Region,
			Share:  fraction(l.Enforcing, l.Limit),
			State:  lease.State(l.State),
		})
	}
	c.mu.Lock()
	c.hist.Record(c.cfg.Clock.Now(), obs)
	c.mu.Unlock()
}

// ServeHTTP serves the overview at /, a policy at /policy/NAME and the
// script and style under /static/. It only reads.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Everything the pages load comes from here; nothing is inlined but
	// the charts' data, which is JSON, not script.
	h.Set("Content-Security-Policy",
		"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri "+
			"'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	c.mux.ServeHTTP(w, r)
}

func fraction(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}
