package console

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// pageView is what every page shows in its header.
type pageView struct {
	Replica   string
	Leader    bool
	Epoch     int64
	LeaderAt  string
	Updated   time.Time
	RefreshMs int64
	// Notice says why part of the page is missing (following, etcd
	// unreachable); Failed marks it an error rather than information.
	Notice string
	Failed bool
}

// overviewView is the overview page.
type overviewView struct {
	pageView
	Quotas []quotaView
}

// quotaView is one quota on the overview.
type quotaView struct {
	Name      string
	Algorithm policy.Algorithm
	Scope     policy.Scope
	// Limit is the policy's limit and burst in words; Unit is what the
	// region numbers count (per second, or per window).
	Limit, Unit string
	Bound       *pb.BoundRecord
	// Booked is what all regions may be enforcing now, in percent of the
	// quota; Leased whether the leases were read.
	Booked float64
	Leased bool
	// PerRegion: scope region, every region enforces the whole limit and
	// holds no share.
	PerRegion bool
	// Edge: the policy is served to Envoy's RLQS, or a region reports
	// Envoy instances holding its buckets: the table shows the edge.
	Edge    bool
	Regions []regionView
	Chart   Chart
	Samples int
}

// regionView is one region's lease on a quota, in the units of
// `coordinator leases` (policy.Units of the admin API's micro-units).
type regionView struct {
	Region, Instance string
	State            lease.State
	Share, SharePct  float64
	Enforcing        float64
	Reserved         float64
	Demand           float64
	ExpiresIn        time.Duration
	// Since is when the lease entered State, if the history saw it.
	Since time.Time
	// NoLease: a declared region that holds no lease on the quota (its
	// agents never asked, or the lease was released and forgotten).
	NoLease bool
	// Edge is what the Envoy instances streaming to the region's agents
	// hold of the quota; nil when none reported any.
	Edge *edgeView
}

// edgeView is a region's edge on a quota (pb.EdgeSummary) in the units of
// `coordinator leases`. AssignedPct is the assigned refill's part of the
// limit, only for a policy without identity attributes (OfLimit): with
// them the limit is each identity's, and the buckets' sum over identities
// says nothing against it (25 tenants' buckets showed 281% of one
// tenant's limit).
type edgeView struct {
	Instances, Buckets, Agents int32
	Library                    int32 // of the instances, Go services using the client library
	Assigned, AssignedPct      float64
	OfLimit                    bool
	Usage                      float64
}

func newEdgeView(l *pb.LeaseRecord, perIdentity bool) *edgeView {
	e := l.Edge
	if e == nil {
		return nil
	}
	return &edgeView{Instances: e.Instances, Library: e.LibraryInstances, Buckets: e.Buckets, Agents: e.Agents,
		Assigned:    policy.Units(e.Assigned),
		AssignedPct: 100 * fraction(e.Assigned, l.Limit), OfLimit: !perIdentity, Usage: policy.Units(e.Usage)}
}

// policyView is one policy's page.
type policyView struct {
	pageView
	Name    string
	Version int64
	YAML    string
	Bound   *pb.BoundRecord
	Terms   []term
	// Regions and Identities: the identities with shares of their own
	// (the top maxIdentityRows by their largest share), each region's
	// share in the units of `coordinator leases`; IdentityCount is how
	// many there are in all.
	Regions       []string
	Identities    []identityRow
	IdentityCount int
}

// identityRow is one identity's shares, in the order of policyView.Regions.
type identityRow struct {
	Identity string
	Shares   []float64
}

// maxIdentityRows bounds the identities a policy page lists.
const maxIdentityRows = 50

type term struct {
	Name  string
	Value float64
}

// requestTimeout bounds the admin calls one page makes.
const requestTimeout = 5 * time.Second

func (c *Console) header() pageView {
	return pageView{Replica: c.src.Replica(), Leader: c.src.IsLeader(), Epoch: c.src.Epoch(), LeaderAt: c.src.Leader(),
		Updated: c.cfg.Clock.Now(), RefreshMs: c.cfg.Refresh.Milliseconds()}
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	v := overviewView{pageView: c.header()}
	code := http.StatusOK
	policies, bounds, err := c.policies(ctx)
	if err != nil {
		v.Notice, v.Failed, code = err.Error(), true, http.StatusServiceUnavailable
		c.render(w, code, "overview", v)
		return
	}
	var leases []*pb.LeaseRecord
	var regions []string // declared, sorted by name
	leased := false
	switch {
	case !v.Leader && v.LeaderAt != "":
		v.Notice = fmt.Sprintf("This replica follows; the leader is at %s. Shares, modes and their history are "+
			"on the leader's console.", v.LeaderAt)
	case !v.Leader:
		v.Notice = "No leader is known yet (election or failover in progress): shares and modes appear once one leads."
	default:
		resp, err := c.src.ListLeases(ctx, &pb.ListLeasesRequest{})
		if err != nil {
			v.Notice, v.Failed = "Leases could not be read: "+err.Error(), true
			break
		}
		leases, leased = resp.Leases, true
		if rr, err := c.src.ListRegions(ctx, &pb.ListRegionsRequest{}); err == nil {
			for _, r := range rr.Regions {
				regions = append(regions, r.Name)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range policies {
		q := quotaView{Name: p.Name, Algorithm: p.Algorithm, Scope: p.Scope, Limit: limitText(p), Unit: unitOf(p),
			Bound: bounds[p.Name], Leased: leased, PerRegion: p.Scope == policy.ScopeRegion, Edge: p.Edge != nil,
			Chart: c.hist.Chart(p.Name, c.cfg.ChartPoints), Samples: c.hist.Len()}
		var enforcing, total int64
		for _, l := range leases {
			if l.Quota != p.Name {
				continue
			}
			since, _ := c.hist.Since(l.Quota, l.Region)
			q.Regions = append(q.Regions, regionView{Region: l.Region, Instance: l.Instance, State: lease.State(l.State),
				Share: policy.Units(l.Rate), SharePct: 100 * fraction(l.Rate, l.Limit), Enforcing: policy.Units(l.Enforcing),
				Reserved: policy.Units(l.Reserved), Demand: policy.Units(l.Demand),
				ExpiresIn: time.Duration(l.ExpiresInMs) * time.Millisecond, Since: since,
				Edge: newEdgeView(l, len(p.Identity) > 0)})
			q.Edge = q.Edge || l.Edge != nil
			enforcing += l.Enforcing
			total = l.Limit
		}
		if !q.PerRegion {
			for _, r := range regions {
				if !slices.ContainsFunc(q.Regions, func(v regionView) bool { return v.Region == r }) {
					q.Regions = append(q.Regions, regionView{Region: r, NoLease: true})
				}
			}
			slices.SortFunc(q.Regions, func(a, b regionView) int { return strings.Compare(a.Region, b.Region) })
		}
		q.Booked = 100 * fraction(enforcing, total)
		v.Quotas = append(v.Quotas, q)
	}
	c.render(w, code, "overview", v)
}

func (c *Console) policy(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	name := r.PathValue("name")
	policies, bounds, err := c.policies(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	i := slices.IndexFunc(policies, func(p *policy.Policy) bool { return p.Name == name })
	if i < 0 {
		http.Error(w, fmt.Sprintf("no policy %q", name), http.StatusNotFound)
		return
	}
	p := policies[i]
	y, err := yaml.Marshal(p)
	if err != nil {
		http.Error(w, fmt.Sprintf("policy %q: %v", name, err), http.StatusInternalServerError)
		return
	}
	v := policyView{pageView: c.header(), Name: p.Name, Version: p.Version, YAML: string(y), Bound: bounds[p.Name]}
	if v.Bound != nil {
		for n, val := range v.Bound.Terms {
			v.Terms = append(v.Terms, term{n, val})
		}
		slices.SortFunc(v.Terms, func(a, b term) int { return strings.Compare(a.Name, b.Name) })
	}
	if v.Leader {
		if resp, err := c.src.ListLeases(ctx, &pb.ListLeasesRequest{}); err == nil {
			v.Regions, v.Identities, v.IdentityCount = identityRows(p.Name, resp.Leases)
		}
	}
	c.render(w, http.StatusOK, "policy", v)
}

// identityRows tabulates quota's identity shares from the leases: the
// regions, the top identities by their largest share, and how many in all.
func identityRows(quota string, leases []*pb.LeaseRecord) ([]string, []identityRow, int) {
	shares := map[string]map[string]int64{} // identity -> region -> share
	var regions []string
	for _, l := range leases {
		if l.Quota != quota {
			continue
		}
		regions = append(regions, l.Region)
		for id, a := range l.Identities {
			if shares[id] == nil {
				shares[id] = map[string]int64{}
			}
			shares[id][l.Region] = a
		}
	}
	slices.Sort(regions)
	largest := func(id string) int64 { return slices.Max(slices.Collect(maps.Values(shares[id]))) }
	ids := slices.SortedFunc(maps.Keys(shares), func(a, b string) int {
		return cmp.Or(cmp.Compare(largest(b), largest(a)), strings.Compare(a, b))
	})
	var rows []identityRow
	for _, id := range ids[:min(len(ids), maxIdentityRows)] {
		row := identityRow{Identity: id}
		for _, r := range regions {
			row.Shares = append(row.Shares, policy.Units(shares[id][r]))
		}
		rows = append(rows, row)
	}
	return regions, rows, len(ids)
}

// policies reads every policy and its bound, by name.
func (c *Console) policies(ctx context.Context) ([]*policy.Policy, map[string]*pb.BoundRecord, error) {
	resp, err := c.src.ListPolicies(ctx, &pb.ListPoliciesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("policies could not be read (is etcd reachable?): %w", err)
	}
	ps, err := leaseapi.DecodePolicies(resp.Policies)
	if err != nil {
		return nil, nil, fmt.Errorf("stored policies: %w", err)
	}
	br, err := c.src.GetBound(ctx, &pb.GetBoundRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("bounds could not be computed: %w", err)
	}
	bounds := map[string]*pb.BoundRecord{}
	for _, b := range br.Bounds {
		bounds[b.Quota] = b
	}
	return ps, bounds, nil
}

func (c *Console) render(w http.ResponseWriter, code int, page string, v any) {
	var b strings.Builder
	if err := c.tmpl.ExecuteTemplate(&b, page, v); err != nil {
		c.cfg.Logger.Error("console page failed", "page", page, "error", err)
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write([]byte(b.String()))
}

// limitText is a policy's limit in words: "60 per 1s, burst 60".
func limitText(p *policy.Policy) string {
	s := num(p.Limit) + " per " + p.Period.String()
	if p.Algorithm == policy.TokenBucket && p.Burst > 0 {
		s += ", burst " + num(p.Burst)
	}
	return s
}

// unitOf names what a quota's shares count (policy.Limits.Amount): a
// token bucket's rate per second, a window's limit per window.
func unitOf(p *policy.Policy) string {
	if p.Algorithm == policy.TokenBucket {
		return "per second"
	}
	return "per " + p.Period.String() + " window"
}
