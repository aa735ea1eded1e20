package edge

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

func testPolicy(t *testing.T, alg policy.Algorithm, limit, burst float64, period time.Duration, cost int64) *policy.Policy {
	t.Helper()
	p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: alg, Limit: limit, Burst: burst, Period: policy.Duration(period), Cost: cost}
	p.Normalize()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTTL(t *testing.T) {
	const drift, margin = 1e-4, 500 * time.Millisecond
	for _, c := range []struct {
		want, left time.Duration
		ttl        time.Duration
		ok         bool
	}{
		{5 * time.Second, 10 * time.Second, 5 * time.Second, true},
		{5 * time.Second, 5 * time.Second, 4 * time.Second, true},
		{5 * time.Second, 1600 * time.Millisecond, time.Second, true},
		{5 * time.Second, 1400 * time.Millisecond, 5 * time.Second, false},
		{2500 * time.Millisecond, time.Hour, 2 * time.Second, true},
		{300 * time.Millisecond, time.Hour, time.Second, true},
	} {
		ttl, ok := TTL(c.want, c.left, drift, margin)
		if ttl != c.ttl || ok != c.ok {
			t.Errorf("TTL(%s, %s) = %s, %v; want %s, %v", c.want, c.left, ttl, ok, c.ttl, c.ok)
		}
		if ok && Lifetime(ttl, drift, margin) > c.left {
			t.Errorf("TTL(%s, %s) = %s outlives the grant", c.want, c.left, ttl)
		}
	}
}

func TestSplitFollowsDemand(t *testing.T) {
	got := Split(1000, []int64{3000, 1000, 0})
	if got[0] != 500 || got[1] != 500 || got[2] != 0 {
		t.Fatalf("split by demand beyond the amount (max-min fair): %v", got)
	}
	// An instance inflating its reports takes what the others leave, never
	// what they ask within an equal part.
	got = Split(1000, []int64{1 << 60, 200, 300})
	if got[1] != 200 || got[2] != 300 || got[0] != 500 {
		t.Fatalf("an inflated report beside honest ones: %v", got)
	}
	got = Split(1000, []int64{100, 300})
	if got[0] < 100 || got[1] < 300 || got[0]+got[1] != 1000 {
		t.Fatalf("demand that fits is met and the rest spread: %v", got)
	}
	// Demand that fits: an equal level for those asking less, whatever
	// they ask, so that the chance in their reports moves no share.
	for _, d := range [][]int64{{100, 200, 50}, {300, 0, 299}} {
		if got := Split(1000, d); got[0] != 334 || got[1] != 333 || got[2] != 333 {
			t.Fatalf("%v fits in 1000: %v, want 334, 333, 333", d, got)
		}
	}
	if got := Split(1000, []int64{100, 600, 50}); got[0] != 200 || got[1] != 600 || got[2] != 200 {
		t.Fatalf("one asking more than the level: %v, want 200, 600, 200", got)
	}
	got = Split(1000, []int64{-1, 600, 200})
	if got[0] != 400 || got[2] != 200 || got[0]+got[1]+got[2] != 1000 { // 400 of 1,200 asked
		t.Fatalf("an unknown demand counts as the mean of the known: %v", got)
	}
	if got := Split(1000, []int64{-1}); got[0] != 1000 {
		t.Fatalf("a lone unknown demand gets it all: %v", got)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 1000; i++ {
		n := 1 + r.IntN(30)
		d := make([]int64, n)
		for j := range d {
			d[j] = r.Int64N(1_000_000) - 100
		}
		amount := r.Int64N(10_000_000)
		var sum int64
		for _, x := range Split(amount, d) {
			if x < 0 {
				t.Fatalf("negative share")
			}
			sum += x
		}
		if sum > amount {
			t.Fatalf("split %d into %d", amount, sum)
		}
	}
}

func TestTarget(t *testing.T) {
	if got := Target(1000, 0, 5000, 0, 1); got != 1000 {
		t.Fatalf("the only demand gets the whole capacity, got %d", got)
	}
	if got := Target(1000, 500, 1000, 500, 4); got != 500 {
		t.Fatalf("demand beyond capacity is served in proportion, got %d", got)
	}
	if got := Target(1000, 1000, 1000, 2000, 1); got < 333 || got > 334 {
		t.Fatalf("no party counts for more than the capacity, got %d", got)
	}
	if got := Target(1000, 500, 1<<60, 0, 4); got < 666 || got > 667 {
		t.Fatalf("an inflated edge demand beside direct checks, got %d", got)
	}
	if got := Target(1000, 0, 0, 500, 1); got != 0 {
		t.Fatalf("no demand of its own, got %d", got)
	}
	if got := Target(1000, 200, 300, 0, 1); got != 550 {
		t.Fatalf("demand that fits is met, the rest spread evenly between one instance and the direct checks: got %d, want 550", got)
	}
	// Four instances hold four buckets, each needing room for bursts; the
	// direct checks pool in one: the rest goes √4 to 1.
	if got := Target(1000, 200, 300, 0, 4); got != 300+333 {
		t.Fatalf("demand that fits, four instances: got %d, want 633", got)
	}
	// The other agents' instances count as many as this agent's: the
	// rest goes √4 : 1 : √4.
	if got := Target(1000, 200, 300, 100, 4); got != 300+160 {
		t.Fatalf("demand that fits beside another agent's, four instances: got %d, want 460", got)
	}
}

func TestSpan(t *testing.T) {
	if _, ok := Span(0, 0); ok {
		t.Fatal("a first report (0s, nothing measured) has no rate")
	}
	if d, _ := Span(4*time.Second, 5*time.Second); d != 5*time.Second {
		t.Fatalf("the measured interval wins over Envoy's truncated seconds: %v", d)
	}
	if d, _ := Span(5*time.Second, 0); d != 5*time.Second {
		t.Fatalf("time_elapsed when nothing is measured: %v", d)
	}
	// The client library's exact interval wins over a receipt the network
	// or the agent's load delayed.
	if d, _ := Span(2500*time.Millisecond, 3*time.Second); d != 2500*time.Millisecond {
		t.Fatalf("an exact time_elapsed loses to the measured interval: %v", d)
	}
}

// A bucket's first rate is measured over at least firstSpan: Envoy's
// report timer ticking 3 ms after a new bucket's first report, with no
// request in between, says nothing of its rate (it read as none, and the
// instance the demand had moved to got no share for a report interval).
func TestFirstRateOverAtLeastFirstSpan(t *testing.T) {
	p := edgePolicy(t)
	s := &Slot{Demand: -1}
	s.Report(p, 1, 0, t0) // the first request, reported at once
	s.Report(p, 0, 0, t0.Add(3*time.Millisecond))
	if s.Demand != -1 {
		t.Fatalf("after a report over 3 ms: demand %d, want still unknown", s.Demand)
	}
	s.Report(p, 2, 0, t0.Add(500*time.Millisecond))
	if s.Demand != -1 {
		t.Fatalf("after reports over 0.5 s: demand %d, want still unknown", s.Demand)
	}
	s.Report(p, 398, 4*time.Second, t0.Add(5003*time.Millisecond))
	if want := DemandAmount(p, 400/5.003); s.Demand != want {
		t.Fatalf("after the next report: demand %d, want %d (400 requests over the three reports, 5.003 s)", s.Demand, want)
	}
}

// A report over less than demandWindow moves the demand toward its rate
// in proportion to the time it covers: a second without requests at
// 3 a second does not take the instance's demand to nothing. Envoy's
// 5 s reports, and a count chance cannot explain, are taken whole.
func TestDemandAveragedOverShortReports(t *testing.T) {
	p := edgePolicy(t)
	perSecond := func(n float64) int64 { return DemandAmount(p, n) }
	s := &Slot{Demand: -1}
	at := t0
	report := func(count uint64, d time.Duration) {
		at = at.Add(d)
		s.Report(p, count, d, at)
	}
	report(3, 1001*time.Millisecond)
	if want := DemandAmount(p, 3/1.001); s.Demand != want {
		t.Fatalf("a first known rate: %d, want %d, taken whole", s.Demand, want)
	}
	report(0, time.Second+time.Millisecond)
	if lo, hi := perSecond(1.9), perSecond(2.1); s.Demand < lo || s.Demand > hi {
		t.Fatalf("a second of no requests after 3/s: demand %d, want about 2/s (%d-%d)", s.Demand, lo, hi)
	}
	report(0, 5*time.Second)
	if s.Demand != 0 {
		t.Fatalf("5 s of no requests: demand %d, want 0", s.Demand)
	}
	report(400, 5*time.Second)
	if s.Demand != perSecond(80) {
		t.Fatalf("a 5 s report of 80/s: demand %d, want %d", s.Demand, perSecond(80))
	}
	// At 80 a second, a second without requests is no chance: the demand
	// moved away, and the next split should follow at once.
	report(0, time.Second+time.Millisecond)
	if s.Demand != 0 {
		t.Fatalf("a second of no requests after 80/s: demand %d, want 0", s.Demand)
	}
}
