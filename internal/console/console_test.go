package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// fakeSource answers like a coordinator: one global policy, two regions.
type fakeSource struct {
	leader      bool
	leaderAt    string
	policiesErr error
	leaseCalls  atomic.Int64
	leases      []*pb.LeaseRecord
}

func (f *fakeSource) ListPolicies(context.Context, *pb.ListPoliciesRequest) (*pb.ListPoliciesResponse, error) {
	if f.policiesErr != nil {
		return nil, f.policiesErr
	}
	ps, err := policy.ParsePolicies([]byte("name: api\nversion: 3\nidentity: [tenant]\nlimit: 60\nperiod: 1s\nfailure: {mode: static-share, static_fraction: 0.1}\n"))
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(ps[0])
	return &pb.ListPoliciesResponse{Policies: []*pb.PolicyRecord{{Name: "api", Version: 3, Json: string(b)}}}, nil
}

func (f *fakeSource) ListLeases(context.Context, *pb.ListLeasesRequest) (*pb.ListLeasesResponse, error) {
	f.leaseCalls.Add(1)
	if !f.leader {
		return nil, status.Error(codes.Unavailable, "not the leader")
	}
	return &pb.ListLeasesResponse{Leases: f.leases}, nil
}

func (f *fakeSource) GetBound(context.Context, *pb.GetBoundRequest) (*pb.GetBoundResponse, error) {
	return &pb.GetBoundResponse{Bounds: []*pb.BoundRecord{{Quota: "api", Limit: 120, WindowSeconds: 1, WorstCase: 240.5, Overshoot: 120.5,
		OvershootRatio: 1.004, Terms: map[string]float64{"lease_skew": 0.5, "degraded": 120}}}}, nil
}

func (f *fakeSource) ListRegions(context.Context, *pb.ListRegionsRequest) (*pb.ListRegionsResponse, error) {
	return &pb.ListRegionsResponse{Regions: []*pb.RegionRecord{{Name: "ap", Weight: 1}, {Name: "eu", Weight: 1}, {Name: "us", Weight: 1}}}, nil
}

func (f *fakeSource) IsLeader() bool { return f.leader }
func (f *fakeSource) Epoch() int64 {
	if f.leader {
		return 7
	}
	return 0
}
func (f *fakeSource) Leader() string  { return f.leaderAt }
func (f *fakeSource) Replica() string { return "coord-a" }

func leader() *fakeSource {
	return &fakeSource{leader: true, leaderAt: "10.0.0.1:7400", leases: []*pb.LeaseRecord{
		{Quota: "api", Region: "eu", Instance: "eu-1", State: "degraded", Rate: 30e6, Enforcing: 6e6, Reserved: 6e6, Demand: 4_916_881, Limit: 60e6},
		{Quota: "api", Region: "us", Instance: "us-1", State: "active", Rate: 30e6, Enforcing: 30e6, ExpiresInMs: 1500, Demand: 18e6, Limit: 60e6},
	}}
}

func newConsole(t *testing.T, src Source) (*Console, *clock.Manual) {
	cfg := DefaultConfig()
	clk := &clock.Manual{}
	clk.Set(t0.UnixMilli())
	cfg.Clock = clk
	c, err := New(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

func get(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Result(), string(b)
}

func TestOverviewOnTheLeader(t *testing.T) {
	src := leader()
	c, clk := newConsole(t, src)
	for range 3 {
		c.Sample(t.Context())
		clk.Set(clk.Now().Add(5 * time.Second).UnixMilli())
	}
	resp, body := get(t, c, "GET", "/")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "Cache-Control"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("no %s header", h)
		}
	}
	for _, want := range []string{
		`<span id="role" class="badge leader">leader</span> epoch <b id="epoch">7</b>`,
		`data-k="limit">60 per 1s, burst 60<`,
		`data-k="worst_case" data-v="240.5">240.5<`,
		`<tr data-region="eu">`,
		`class="badge state-degraded" data-k="state">degraded<`,
		`data-k="share" data-v="30">30 <small>(50.0%)</small>`,
		`data-k="demand" data-v="4.916881">4.917<`,     // shown rounded, kept exact
		`data-k="booked" data-v="60">60.0%<`,           // (6 + 30) of 60
		`data-k="since">12:00:00 UTC <small>(15s ago)`, // since the first sample
		`href="/policy/api"`,
		`<tr data-region="ap">`, // declared, never leased
		`class="badge state-none" data-k="state"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	m := regexp.MustCompile(`<script type="application/json" id="chart-0">(.*?)</script>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no chart data")
	}
	var ch Chart
	if err := json.Unmarshal([]byte(m[1]), &ch); err != nil {
		t.Fatalf("chart data is not JSON: %v\n%s", err, m[1])
	}
	if len(ch.Times) != 3 || len(ch.Regions) != 2 || ch.Regions[0].States != "ddd" || ch.Regions[1].Share[2] != 50 {
		t.Fatalf("chart: %+v", ch)
	}
	if t.Failed() {
		t.Log(body)
	}
}

// A region whose agents report Envoy instances holding the quota's
// buckets shows them in the quota's edge table (library clients named
// apart), in the quota's units; a
// region without says so; a region without a lease has no row, and a
// quota nobody serves at the edge has no edge table.
func TestOverviewEdge(t *testing.T) {
	src := leader()
	c, _ := newConsole(t, src)
	if _, body := get(t, c, "GET", "/"); strings.Contains(body, "data-edge-region") {
		t.Fatal("a quota without an edge shows an edge table")
	}
	src.leases[1].Edge = &pb.EdgeSummary{Instances: 20, LibraryInstances: 5, Buckets: 1000, Assigned: 27_500_000, Usage: 91_250_000, Agents: 2}
	_, body := get(t, c, "GET", "/")
	for _, want := range []string{
		`<th class="n">assigned <small>per second</small></th>`,
		`<tr data-edge-region="us">`,
		`data-k="instances" data-v="20">20 (5 library)<`,
		`data-k="buckets" data-v="1000">1000<`,
		// api's limit is each tenant's: the sum over tenants is no part of it.
		`data-k="assigned" data-v="27.5" title="summed over the identities' buckets; the limit is each identity's">27.5 <small>(all identities)</small>`,
		`data-k="usage" data-v="91.25">91.25<`,
		`data-k="agents" data-v="2">2<`,
		`<tr data-edge-region="eu">`,
		`data-k="instances" data-v="0" colspan="5">no Envoy instance or library client streams`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	if strings.Contains(body, `data-edge-region="ap"`) {
		t.Error("a region without a lease has an edge row")
	}
	if t.Failed() {
		t.Log(body)
	}
}

func TestOverviewOnAFollower(t *testing.T) {
	src := &fakeSource{leaderAt: "10.0.0.2:7400"}
	c, _ := newConsole(t, src)
	c.Sample(t.Context())
	resp, body := get(t, c, "GET", "/")
	if resp.StatusCode != 200 {
		t.Fatalf("GET / on a follower: %d", resp.StatusCode)
	}
	if src.leaseCalls.Load() != 0 {
		t.Fatal("a follower's console asked for leases only the leader has")
	}
	for _, want := range []string{"follower", "the leader is at 10.0.0.2:7400", `data-k="worst_case"`} {
		if !strings.Contains(body, want) {
			t.Errorf("follower's overview lacks %q", want)
		}
	}
	if strings.Contains(body, "data-region") || strings.Contains(body, `data-k="booked"`) {
		t.Error("a follower's overview shows leases")
	}
	src.leaderAt = ""
	if _, body := get(t, c, "GET", "/"); !strings.Contains(body, "No leader is known yet") {
		t.Error("no word that no leader is known")
	}
}

func TestOverviewWithoutEtcd(t *testing.T) {
	src := leader()
	src.policiesErr = status.Error(codes.Unavailable, "context deadline exceeded")
	c, _ := newConsole(t, src)
	resp, body := get(t, c, "GET", "/")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "is etcd reachable?") {
		t.Fatalf("GET / without etcd: %d\n%s", resp.StatusCode, body)
	}
}

func TestPolicyPage(t *testing.T) {
	c, _ := newConsole(t, leader())
	resp, body := get(t, c, "GET", "/policy/api")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /policy/api: %d", resp.StatusCode)
	}
	for _, want := range []string{"version 3", "limit: 60", "static_fraction: 0.1", "<td>degraded</td>", "<td>lease_skew</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("policy page lacks %q", want)
		}
	}
	if resp, _ := get(t, c, "GET", "/policy/nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown policy: %d", resp.StatusCode)
	}
	if strings.Contains(body, "Identities with shares") {
		t.Error("a policy without identity shares lists some")
	}
}

// The policy page lists the identities with shares of their own, the one
// with the largest share first, and each region's share of it.
func TestPolicyPageIdentityShares(t *testing.T) {
	src := leader()
	src.leases[0].Identities = map[string]int64{"tenant=a": 0, "tenant=b": 60e6}
	src.leases[1].Identities = map[string]int64{"tenant=a": 60e6, "tenant=b": 0, "tenant=c": 15e6}
	c, _ := newConsole(t, src)
	_, body := get(t, c, "GET", "/policy/api")
	for _, want := range []string{"3 identities hold shares of their own", "<th class=\"n\">eu</th><th class=\"n\">us</th>",
		"<td>tenant=a</td><td class=\"n\">0</td><td class=\"n\">60</td>", "<td>tenant=c</td><td class=\"n\">0</td><td class=\"n\">15</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("policy page lacks %q", want)
		}
	}
	if a, cc := strings.Index(body, "tenant=a"), strings.Index(body, "tenant=c"); a > cc {
		t.Error("the identity with the larger share is not listed first")
	}
}

func TestReadOnlyAndStatic(t *testing.T) {
	src := leader()
	c, _ := newConsole(t, src)
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		if resp, _ := get(t, c, m, "/"); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /: %d, want 405", m, resp.StatusCode)
		}
	}
	if resp, _ := get(t, c, "GET", "/no/such/page"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown page: %d", resp.StatusCode)
	}
	for path, typ := range map[string]string{"/static/console.js": "javascript", "/static/console.css": "text/css"} {
		resp, body := get(t, c, "GET", path)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), typ) || len(body) < 500 {
			t.Errorf("%s: %d %q, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Config){
		"sample too often":    func(c *Config) { c.SampleEvery = time.Millisecond },
		"keep under a sample": func(c *Config) { c.Keep = time.Second },
		"too many samples":    func(c *Config) { c.SampleEvery, c.Keep = 100*time.Millisecond, 1000*time.Hour },
		"refresh too often":   func(c *Config) { c.Refresh = time.Millisecond },
		"one chart point":     func(c *Config) { c.ChartPoints = 1 },
		"no clock":            func(c *Config) { c.Clock = nil },
		"no logger":           func(c *Config) { c.Logger = nil },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := New(leader(), cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
