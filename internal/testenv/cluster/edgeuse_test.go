package cluster

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// usePolicy is one tenant's limit of 100 a second, served at the edge to
// the 10 Envoy instances each region runs.
const usePolicy = `name: tenant-api
identity: [tenant]
limit: 100
period: 1s
burst: 100
edge: {instances: 10, no_assignment: deny}
`

// An Envoy user moving a per-tenant limit from ShouldRateLimit to RLQS:
// two regions, each with its agent and 10 Envoy-like clients on one tenant,
// asking twice its limit in all. Once the shares settled, the edge admits
// at least 90% of the limit (the clients' own records), and no 1 s window
// goes past the published bound. Each client's bucket is a tenth of its
// region's share: a bucket of one token, which Envoy from before fill
// ratios needed (every change could start it full), admitted about 80%.
func TestEdgeUsesTheLimit(t *testing.T) {
	testenv.SkipMultiProcess(t)
	regions := []string{"us", "eu"}
	// Leases of 10 s: a grant outlives the assignments' 4 s.
	c, p, edges := edgeFleet(t, usePolicy, Options{Regions: regions, Coordinators: 1, LeaseDuration: 10 * time.Second}, "shop", 10, regions...)
	bucket := map[string]string{"policy": "tenant-api", "tenant": "a"}
	d, stop := drive(t, bucket, 10, edges...)
	waitAllAssigned(t, bucket, edges...)
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
	from := time.Now()
	time.Sleep(15 * time.Second)
	to := time.Now()
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
	stop()

	var adm []Admission
	n := 0
	perSecond := map[string][]int{}
	for _, e := range edges {
		perSecond[e.Region] = make([]int, int(to.Sub(from)/time.Second)+1)
		for _, a := range e.Admissions() {
			adm = append(adm, a)
			if !a.At.Before(from) && a.At.Before(to) {
				n++
				perSecond[e.Region][a.At.Sub(from)/time.Second]++
			}
		}
	}
	t.Logf("admitted a second: %v", perSecond)
	decided, allowed := d.Decisions()
	t.Logf("%d decisions, %d allowed; us clients %+v", decided, allowed, edges[0].Stats())
	ideal := p.Limit * to.Sub(from).Seconds()
	t.Logf("the edge admitted %d in %s, %.1f%% of the limit's %.0f", n, to.Sub(from).Round(time.Millisecond), 100*float64(n)/ideal, ideal)
	if float64(n) < 0.9*ideal {
		t.Errorf("the edge admitted %d, under 90%% of the limit's %.0f", n, ideal)
	}
	dep := bound.Deployment{Regions: len(regions), Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: lease.DefaultTiming.Drift, RedisOutages: true}
	checkPublished(t, c, p, dep)
	checkEdgeWindows(t, adm, p, dep, time.Second, 0)
}
