package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// edgeFleet starts a cluster (o) serving the edge policy yaml, and in each
// of regions envoys Envoy-like clients with one filter of domain, the
// policy's bucket settings and reports every second. The clients close
// with the test.
func edgeFleet(t *testing.T, yaml string, o Options, domain string, envoys int, regions ...string) (*Cluster, *policy.Policy, []*Edge) {
	t.Helper()
	c := startWith(t, yaml, o)
	for _, a := range c.Agents {
		if err := a.WaitKnows(t.Context(), yaml); err != nil {
			t.Fatal(err)
		}
	}
	p := policyOf(t, yaml)
	settings, err := rlqsenvoy.SettingsFor(p.Edge, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clients := EdgeOptions{Envoys: envoys, Filters: []EdgeFilter{{Domain: domain, Settings: settings}},
		ReportInterval: time.Second}
	var edges []*Edge
	for _, r := range regions {
		edges = append(edges, startEdge(t, c, r, clients))
	}
	return c, p, edges
}

// startEdge starts Envoy-like clients (o) behind c's region, closed at the
// end of t.
func startEdge(t testing.TB, c *Cluster, region string, o EdgeOptions) *Edge {
	t.Helper()
	e, err := c.StartEdge(t.Context(), region, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// tenantFleet is one tenant's traffic at the edge: a cluster of regions us
// and eu (one coordinator; leases of 10 s, so that a grant outlives the
// assignments' 4 s) serving a policy of 100 requests a second per tenant,
// and Envoy-like clients sending tenant a's requests.
type tenantFleet struct {
	c      *Cluster
	p      *policy.Policy
	edges  []*Edge           // the clients, by region
	bucket map[string]string // tenant a's
	d      *EdgeDriver       // the clients' traffic
	stop   func()            // ends the traffic (at the test's end if not before)
}

// startTenantFleet starts a tenantFleet whose policy, name, is served at
// the edge to envoys instances per region, which deny while they hold no
// assignment, with envoys clients in each region of serve, each sending
// rate requests a second; it returns once every client holds an
// assignment.
func startTenantFleet(t *testing.T, name string, envoys int, rate float64, serve ...string) *tenantFleet {
	t.Helper()
	yaml := fmt.Sprintf("name: %s\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nburst: 100\n"+
		"edge: {instances: %d, no_assignment: deny}\n", name, envoys)
	o := Options{Regions: []string{"us", "eu"}, Coordinators: 1, LeaseDuration: 10 * time.Second}
	f := &tenantFleet{bucket: map[string]string{"policy": name, "tenant": "a"}}
	f.c, f.p, f.edges = edgeFleet(t, yaml, o, "shop", envoys, serve...)
	f.d, f.stop = drive(t, f.bucket, rate, f.edges...)
	waitAllAssigned(t, f.bucket, f.edges...)
	return f
}

// admissions are what the clients of edges admitted, by their own records.
func admissions(edges []*Edge) []Admission {
	var adm []Admission
	for _, e := range edges {
		adm = append(adm, e.Admissions()...)
	}
	return adm
}

// edgeDeployment is c's deployment as the bound of the edge tests counts
// it: an agent per region, Redis outages included.
func edgeDeployment(c *Cluster) bound.Deployment {
	return bound.Deployment{Regions: len(c.Opts.Regions), Instances: 1, LeaseDuration: c.Opts.LeaseDuration,
		Drift: lease.DefaultTiming.Drift, RedisOutages: true}
}

// assigned reports whether in holds an assignment for bucket.
func assigned(in *rlqsenvoy.Instance, bucket map[string]string) bool {
	st, ok := in.State(bucket)
	return ok && st.Assigned
}

// waitAllAssigned waits until every client of edges holds an assignment for
// bucket.
func waitAllAssigned(t *testing.T, bucket map[string]string, edges ...*Edge) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "every Envoy assigned", func() bool {
		for _, e := range edges {
			for _, in := range e.Instances(0) {
				if !assigned(in, bucket) {
					return false
				}
			}
		}
		return true
	})
}

// drive sends rate requests a second for bucket through every client of
// edges (for at most 2 minutes) until the returned stop, which waits for
// the clients and runs at the test's end if not called before.
func drive(t *testing.T, bucket map[string]string, rate float64, edges ...*Edge) (d *EdgeDriver, stop func()) {
	return driveLoad(t, EdgeLoad{Demand: func(string, int, time.Duration) []EdgeDemand { return []EdgeDemand{{Bucket: bucket, Rate: rate}} }}, edges...)
}

// driveLoad is drive for any load.
func driveLoad(t *testing.T, load EdgeLoad, edges ...*Edge) (d *EdgeDriver, stop func()) {
	d = NewEdgeDriver()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(ctx, 2*time.Minute, load, edges...) }()
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return d, stop
}

// cutStreams cuts (or restores) the streams of every Envoy-like client of
// edges to their agents.
func cutStreams(cut bool, edges ...*Edge) {
	for _, e := range edges {
		for _, px := range e.Proxies {
			if cut {
				px.Cut()
			} else {
				px.Restore()
			}
		}
	}
}

// pauseRedis stops region's redis-server (SIGSTOP) for d, then resumes it.
func pauseRedis(t *testing.T, c *Cluster, region string, d time.Duration) {
	t.Helper()
	r := c.Redis[slices.Index(c.Opts.Regions, region)]
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d)
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
}
