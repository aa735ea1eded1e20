package cluster

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
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
	var edges []*Edge
	for _, r := range regions {
		e, err := c.StartEdge(t.Context(), r, EdgeOptions{Envoys: envoys, Filters: []EdgeFilter{{Domain: domain, Settings: settings}}, ReportInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		edges = append(edges, e)
	}
	return c, p, edges
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
	d = NewEdgeDriver()
	load := EdgeLoad{Demand: func(string, int, time.Duration) []EdgeDemand { return []EdgeDemand{{Bucket: bucket, Rate: rate}} }}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(ctx, 2*time.Minute, load, edges...) }()
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return d, stop
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
