package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
)

// EdgeFilter is one rate_limit_quota filter of an Envoy: its domain and
// the bucket settings its buckets are matched with. Envoy opens one stream
// per (server, domain).
type EdgeFilter struct {
	Domain   string
	Settings *rlqfv3.RateLimitQuotaBucketSettings
}

// EdgeOptions shape the Envoy-like clients behind one region.
type EdgeOptions struct {
	// Envoys is how many Envoy-like clients the region runs.
	Envoys int
	// Filters are every client's filters; each is one rlqsenvoy.Instance
	// with its own stream.
	Filters []EdgeFilter
	// ReportInterval is every client's report period (Envoy's is 5 s).
	ReportInterval time.Duration
}

// Envoy is one Envoy-like client: an rlqsenvoy.Instance per filter, in
// EdgeOptions.Filters' order.
type Envoy struct {
	Name    string
	Filters []*rlqsenvoy.Instance
}

// Edge is a region's Envoy-like clients. Each reaches the region's agents
// as an Envoy cluster listing every agent instance does, through fault
// proxies in front of the agents' gRPC ports (Proxies, one per agent
// instance of the region, in Cluster.Agents' order): client i lists agent
// i mod n first (pick_first, so the clients are spread over the agents) and
// moves to the next when its agent is gone. Cutting a proxy cuts the
// streams of the clients on that agent.
type Edge struct {
	Region  string
	Proxies []*faultproxy.Proxy
	Envoys  []*Envoy
	opts    EdgeOptions
}

// StartEdge starts o.Envoys Envoy-like clients behind region, streaming
// to its agents over mutual TLS as a service.
func (c *Cluster) StartEdge(ctx context.Context, region string, o EdgeOptions) (_ *Edge, err error) {
	agents := c.RegionAgents(region)
	if len(agents) == 0 || o.Envoys < 1 || len(o.Filters) == 0 {
		return nil, fmt.Errorf("edge of %s: %d agents, %d Envoys, %d filters", region, len(agents), o.Envoys, len(o.Filters))
	}
	e := &Edge{Region: region, opts: o}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	for _, a := range agents {
		px, err := faultproxy.Start(a.Addr)
		if err != nil {
			return nil, err
		}
		e.Proxies = append(e.Proxies, px)
	}
	tc, err := mtls.Client(c.pki.service, "localhost")
	if err != nil {
		return nil, err
	}
	creds := credentials.NewTLS(tc)
	for i := range o.Envoys {
		name := fmt.Sprintf("envoy-%s-%d", region, i+1)
		// The cluster's hosts, this client's agent first.
		var st resolver.State
		for j := range e.Proxies {
			st.Addresses = append(st.Addresses, resolver.Address{Addr: e.Proxies[(i+j)%len(e.Proxies)].Addr})
		}
		env := &Envoy{Name: name}
		e.Envoys = append(e.Envoys, env)
		for fi, f := range o.Filters {
			r := manual.NewBuilderWithScheme(fmt.Sprintf("edge-%s-%d-%d", region, i, fi))
			r.InitialState(st)
			cfg := rlqsenvoy.DefaultConfig()
			cfg.Name, cfg.Domain, cfg.Settings, cfg.ReportInterval = name+"/"+f.Domain, f.Domain, f.Settings, o.ReportInterval
			cfg.Target = r.Scheme() + ":///agents"
			cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithResolvers(r)}
			in, err := rlqsenvoy.New(ctx, cfg)
			if err != nil {
				return nil, err
			}
			env.Filters = append(env.Filters, in)
		}
	}
	return e, nil
}

// Instances are every client's instances of filter fi.
func (e *Edge) Instances(fi int) []*rlqsenvoy.Instance {
	out := make([]*rlqsenvoy.Instance, len(e.Envoys))
	for i, env := range e.Envoys {
		out[i] = env.Filters[fi]
	}
	return out
}

// Close closes every client and proxy.
func (e *Edge) Close() error {
	var errs []error
	for _, env := range e.Envoys {
		for _, in := range env.Filters {
			errs = append(errs, in.Close())
		}
	}
	for _, px := range e.Proxies {
		errs = append(errs, px.Close())
	}
	return errors.Join(errs...)
}

// Stats are the region's clients' counters, summed.
func (e *Edge) Stats() rlqsenvoy.Stats {
	f := rlqsenvoy.Fleet{}
	for _, env := range e.Envoys {
		f.Instances = append(f.Instances, env.Filters...)
	}
	return f.Stats()
}

// Admissions are the clients' own records of every request they admitted,
// as Admissions of the policy their bucket names (its "policy" entry, as
// the agent maps buckets of a domain that is not an envoyproxy/ratelimit
// configuration's) and the identity its other entries make (their values
// in key order, comma-separated: the attribute's value for a policy of one
// attribute, as the Driver records). Mode is "edge".
func (e *Edge) Admissions() []Admission {
	var out []Admission
	for _, env := range e.Envoys {
		for _, in := range env.Filters {
			for _, r := range in.Records() {
				p, id := bucketIdentity(r.Bucket)
				for _, at := range r.Admitted {
					out = append(out, Admission{At: at, Region: e.Region, Policy: p, Identity: id, Mode: "edge"})
				}
			}
		}
	}
	return out
}

// bucketIdentity is the policy a bucket names and its identity.
func bucketIdentity(b map[string]string) (policy, identity string) {
	var vals []string
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if k != "policy" {
			vals = append(vals, b[k])
		}
	}
	return b["policy"], strings.Join(vals, ",")
}

// EdgeDemand is one bucket's requests per second at one client.
type EdgeDemand struct {
	// Filter is the index of the filter whose buckets it is.
	Filter int
	Bucket map[string]string
	Rate   float64
}

// EdgeLoad is traffic at the edge: Demand says what client i of region
// asks at elapsed, listing the client's buckets in the same order each
// time (what is owed is kept by position). It is read every DemandEvery
// (100 ms by default) and sent in steps of Step (20 ms by default), each
// request decided by the client itself.
type EdgeLoad struct {
	Demand      func(region string, client int, elapsed time.Duration) []EdgeDemand
	DemandEvery time.Duration
	Step        time.Duration
}

// EdgeDriver sends EdgeLoads through Edges' clients and counts the
// decisions; the admissions are in the clients' own records
// (Edge.Admissions).
type EdgeDriver struct {
	start              time.Time
	allowed, decisions atomic.Int64
}

// NewEdgeDriver returns a driver whose elapsed time starts now.
func NewEdgeDriver() *EdgeDriver { return &EdgeDriver{start: time.Now()} }

// Decisions are the requests decided at the edge so far, and of them
// those allowed.
func (d *EdgeDriver) Decisions() (decided, allowed int64) {
	return d.decisions.Load(), d.allowed.Load()
}

// Run sends l through every client of edges until ctx ends or dur passes:
// one goroutine per client, each bounded by time and by its demand.
func (d *EdgeDriver) Run(ctx context.Context, dur time.Duration, l EdgeLoad, edges ...*Edge) {
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	if l.DemandEvery <= 0 {
		l.DemandEvery = 100 * time.Millisecond
	}
	if l.Step <= 0 {
		l.Step = 20 * time.Millisecond
	}
	var wg sync.WaitGroup
	for _, e := range edges {
		for i, env := range e.Envoys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.client(ctx, l, e.Region, i, env)
			}()
		}
	}
	wg.Wait()
}

func (d *EdgeDriver) client(ctx context.Context, l EdgeLoad, region string, i int, env *Envoy) {
	step := time.NewTicker(l.Step)
	defer step.Stop()
	var demand []EdgeDemand
	var owed []float64 // requests due and not yet sent, by position in demand
	var read, last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-step.C:
			if now.Sub(read) >= l.DemandEvery {
				demand, read = l.Demand(region, i, now.Sub(d.start)), now
				if len(owed) != len(demand) {
					owed = make([]float64, len(demand))
				}
			}
			dt := l.Step.Seconds()
			if !last.IsZero() {
				dt = min(now.Sub(last).Seconds(), 10*l.Step.Seconds()) // a stalled step sends its debt, capped
			}
			last = now
			for j, dm := range demand {
				owed[j] += dm.Rate * dt
				for ; owed[j] >= 1 && ctx.Err() == nil; owed[j]-- {
					dec := env.Filters[dm.Filter].Allow(dm.Bucket)
					d.decisions.Add(1)
					if dec.Allowed {
						d.allowed.Add(1)
					}
				}
			}
		}
	}
}
