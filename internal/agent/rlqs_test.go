package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

var acme = map[string]string{"policy": "api", "tenant": "acme"}

// Two Envoy instances report one tenant's bucket, together beyond the
// limit, one asking less than an equal part (25 of 100 a second): it gets
// what it asks and the other the rest (max-min fair, edge.Split), a 3:1
// split, and together they refill no more than the region's capacity.
func TestRLQSSplitFollowsDemand(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy, fastEdge)
	a, b := startEnvoy(t, ra.grpcAddr, "a"), startEnvoy(t, ra.grpcAddr, "b")
	stop := make(chan struct{})
	defer close(stop)
	go drive(a, acme, 300, stop, 20*time.Second)
	go drive(b, acme, 25, stop, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "a 3:1 split", func() bool {
		ra, rb := assignedRate(a, acme), assignedRate(b, acme)
		return rb > 0 && ra/rb > 2.6 && ra/rb < 3.4
	})
	ra2, rb := assignedRate(a, acme), assignedRate(b, acme)
	if c := regionRate(ra.a, "api", "acme", 100); ra2+rb > c*1.001 {
		t.Fatalf("assigned %.1f + %.1f requests/s, the region may enforce %.1f", ra2, rb, c)
	}
	t.Logf("assigned %.1f and %.1f requests/s of the region's %.1f", ra2, rb, regionRate(ra.a, "api", "acme", 100))
}

// Demand moves from one Envoy instance to another: the second gets at
// least 90% of the region's capacity within two reporting intervals and
// the life of the first's last larger assignment (which it may enforce
// until then: Envoy acknowledges nothing).
func TestRLQSDemandMoves(t *testing.T) {
	const every = 1200 * time.Millisecond // TTL 1s (Envoy's least) plus the margin fits in one
	ra := regionAgent(t, edgeTestPolicy, fastEdge)
	a, b := startEnvoyEvery(t, ra.grpcAddr, "a", every), startEnvoyEvery(t, ra.grpcAddr, "b", every)
	stopA, stopB := make(chan struct{}), make(chan struct{})
	defer close(stopB)
	go drive(a, acme, 400, stopA, 20*time.Second)
	b.Allow(acme) // b holds the bucket too, idle
	testenv.WaitFor(t, 10*time.Second, "a holding most of the region's capacity", func() bool {
		return assignedRate(a, acme) >= 0.9*regionRate(ra.a, "api", "acme", 100) && regionRate(ra.a, "api", "acme", 100) > 50
	})
	close(stopA)
	moved := time.Now()
	go drive(b, acme, 400, stopB, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "b holding 90% of the region's capacity", func() bool {
		return assignedRate(b, acme) >= 0.9*regionRate(ra.a, "api", "acme", 100)
	})
	took := time.Since(moved)
	t.Logf("b got 90%% of the region's capacity %s (%.2f reporting intervals) after the demand moved", took.Round(10*time.Millisecond), took.Seconds()/every.Seconds())
	if limit := 2*every + 1100*time.Millisecond; took > limit {
		t.Fatalf("took %s, more than two reporting intervals and one assignment's life (%s)", took, limit)
	}
}

// Direct checks and two Envoy instances ask for one tenant, each beyond
// the limit, while the split between them moves and a stream is cut: what
// they admitted together (counted from their own records) never exceeds,
// in any window, what one limiter of the policy admits (the region holds
// the whole limit; the edge term is 0, Envoy denying without an
// assignment). Without the edge's reservation the direct path would admit
// its whole share beside the edge's.
func TestRLQSDirectAndEdgeWithinLimit(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy, fastEdge)
	a, b := startEnvoy(t, ra.grpcAddr, "a"), startEnvoy(t, ra.grpcAddr, "b")
	tr := newEdgeTraffic(t)
	tr.drive(a, 300, 20*time.Second)
	tr.drive(b, 100, 20*time.Second)
	tr.check(t, ra.a, 4*time.Millisecond)
	testenv.WaitFor(t, 10*time.Second, "both paths admitting", func() bool {
		return assignedRate(a, acme) > 0 && assignedRate(b, acme) > 0 && tr.rec.count() > 50
	})
	time.Sleep(2 * time.Second) // traffic runs; the checks are below, on the records
	b.ResetStream()
	time.Sleep(3 * time.Second)
	withinLimit(t, tr.end(), 100, 100)
	if s := a.Stats(); s.Allowed < 100 {
		t.Fatalf("the edge admitted only %d: %+v", s.Allowed, s)
	}
}
