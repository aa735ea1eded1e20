package cluster

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// sybilPolicy promises at most 4 Envoy instances per region, each falling
// back to a token bucket of 20 once its assignment expired: an edge term of
// 2 regions x 4 instances x that bucket's worst case.
const sybilPolicy = `name: shared
identity: [api]
limit: 100
period: 1s
burst: 100
edge: {instances: 4, no_assignment: deny, ttl: 1s, expired: {rule: token_bucket, max_tokens: 20, tokens_per_second: 20, timeout: 10s}}
`

// Four times the instances the policy promises connect in each region
// and ask for its one bucket, then every stream is cut for longer than an
// assignment lives, so that each instance holding an assignment falls
// back to its own token bucket. Counted from the clients' own records,
// every window stays within the published bound: instances beyond the
// promise never got an assignment, so they keep denying. (Served, as
// before, each would run a fallback the edge term does not count.)
func TestEdgeInstancesBeyondThePromise(t *testing.T) {
	testenv.SkipMultiProcess(t)
	regions := []string{"us", "eu"}
	const perRegion = 16
	// Leases of 10 s: a grant outlives the assignments' life, so the
	// promised instances get buckets (with the default, every assignment
	// would outlive the grant, and nothing would be assigned).
	c, p, edges := edgeFleet(t, sybilPolicy, Options{Regions: regions, Coordinators: 1, LeaseDuration: 10 * time.Second}, "shared", perRegion, regions...)
	bucket := map[string]string{"policy": "shared", "api": "all"}
	d, stop := drive(t, bucket, 50, edges...)

	held := func() int {
		n := 0
		for _, e := range edges {
			for _, in := range e.Instances(0) {
				if assigned(in, bucket) {
					n++
				}
			}
		}
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "the promised instances assigned", func() bool { return held() >= len(regions)*p.Edge.Instances })
	time.Sleep(3 * time.Second)
	before := held()
	cutStreams(true, edges...)
	time.Sleep(4 * time.Second) // past every assignment's life: the fallbacks run
	cutStreams(false, edges...)
	time.Sleep(3 * time.Second)
	stop()

	adm := admissions(edges)
	decided, allowed := d.Decisions()
	t.Logf("%d Envoy-like clients per region (the policy promises %d): %d decisions, %d allowed", perRegion, p.Edge.Instances, decided, allowed)
	dep := edgeDeployment(c)
	checkPublished(t, c, p, dep)
	for _, w := range []time.Duration{time.Second, 5 * time.Second} {
		checkWindows(t, adm, p, dep, w, 0)
	}
	if before != len(regions)*p.Edge.Instances {
		t.Errorf("%d instances held an assignment before the cut, want the policy's %d per region", before, p.Edge.Instances)
	}
}
