package cluster

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// An Envoy user moving a per-tenant limit from ShouldRateLimit to RLQS:
// two regions, each with its agent and 10 Envoy-like clients on one tenant,
// asking twice its limit in all. Once the shares settled, the edge admits
// at least 90% of the limit (the clients' own records), at least 75%
// across a 3 s pause of one region's Redis (82-96%: a pause that begins
// as the region's reservation entry is due for rewriting stops its
// assignments once the entry may have expired, a second or so in, until
// Redis answers), at least 65% over the 10 s after one region's agent is
// killed and restarted (74-89%; about 58% when it waited out the dead
// process's entry, before this took it over): it takes over the dead process's
// reservation and instances (edge/inherit.go) once the dead heartbeat is
// stale, 1-2 s in, and buckets that expire before then go dark; where the
// dead process's instances held uneven shares, it waits for the old entry
// to expire, about 5 s more. No 1 s window goes past the published bound. Each
// client's part is a tenth of its region's share: sized for buckets that
// start full at every change, a bucket of one token, which admitted 67%.
func TestEdgeUsesTheLimit(t *testing.T) {
	testenv.SkipMultiProcess(t)
	// The tenant's limit of 100 a second, served at the edge to the 10
	// Envoy instances each region runs.
	f := startTenantFleet(t, "tenant-api", 10, 10, "us", "eu")
	c, p, edges, bucket := f.c, f.p, f.edges, f.bucket
	// Settled: the regions' shares of the tenant split by its demand (the
	// first split comes while the demand is still being measured), and
	// every bucket grown to most of its part's burst (5 tokens) as the
	// slack its first start used came back.
	testenv.WaitFor(t, 45*time.Second, "every Envoy's bucket grown", func() bool {
		for _, e := range edges {
			for _, in := range e.Instances(0) {
				if st, _ := in.State(bucket); st.Strategy.GetTokenBucket().GetMaxTokens() < 4 {
					return false
				}
			}
		}
		return true
	})
	steady := stretch{from: time.Now()}
	time.Sleep(15 * time.Second)
	steady.to = time.Now()
	logEdges(t, c, bucket, edges)

	// Through a fault: us's Redis paused for 3 s (SIGSTOP).
	faults := stretch{from: time.Now()}
	pauseRedis(t, c, "us", 3*time.Second)
	time.Sleep(7 * time.Second)
	faults.to = time.Now()

	// Through a restart: us's agent killed (SIGKILL) and started again at
	// once under its name, as a StatefulSet or systemd restarts it.
	restart := stretch{from: time.Now()}
	ag := c.RegionAgents("us")[0]
	ag.Kill()
	if err := ag.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	restart.to = time.Now()
	f.stop()

	adm := admissions(edges)
	decided, allowed := f.d.Decisions()
	t.Logf("%d decisions, %d allowed", decided, allowed)
	for _, st := range []struct {
		name string
		stretch
		least float64
	}{{"steadily", steady, 0.9}, {"through a 3 s Redis pause", faults, 0.75}, {"through an agent restart", restart, 0.65}} {
		n := st.admitted(adm)
		ideal := p.Limit * st.to.Sub(st.from).Seconds()
		t.Logf("%s the edge admitted %d in %s, %.1f%% of the limit's %.0f", st.name, n, st.to.Sub(st.from).Round(time.Millisecond), 100*float64(n)/ideal, ideal)
		if float64(n) < st.least*ideal {
			t.Errorf("%s the edge admitted %d, under %.0f%% of the limit's %.0f", st.name, n, 100*st.least, ideal)
		}
	}
	dep := edgeDeployment(c)
	checkPublished(t, c, p, dep)
	checkWindows(t, adm, p, dep, time.Second, 0)
}

// stretch is a measured stretch of a test's time.
type stretch struct{ from, to time.Time }

// admitted counts the admissions of adm within s.
func (s stretch) admitted(adm []Admission) int {
	n := 0
	for _, a := range adm {
		if !a.At.Before(s.from) && a.At.Before(s.to) {
			n++
		}
	}
	return n
}

// logEdges logs what each region's Envoy-like clients hold for bucket and
// the coordinator's leases: what a failed utilization check needs.
func logEdges(t *testing.T, c *Cluster, bucket map[string]string, edges []*Edge) {
	t.Helper()
	for _, e := range edges {
		var held []string
		for _, in := range e.Instances(0) {
			st, _ := in.State(bucket)
			held = append(held, st.Strategy.String())
		}
		t.Logf("%s: Envoy's buckets %q", e.Region, held)
	}
	if ls, err := c.Leases(t.Context()); err == nil {
		for _, l := range ls {
			t.Logf("%s: the tenant's shares %v (micro-units a second), Envoy's %v", l.Region, l.Identities, l.Edge)
		}
	}
}
