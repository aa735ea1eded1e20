package edge

import (
	"math"
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

// The token bucket an instance gets never admits, in any window, more than
// its share admits in that window, even when it starts full at every
// change (as often as the change interval allows): for every algorithm.
func TestAssignWithinShare(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	algs := []policy.Algorithm{policy.TokenBucket, policy.FixedWindow, policy.SlidingWindow, policy.SlidingLog}
	windows := []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 2500 * time.Millisecond, 10 * time.Second, time.Minute, time.Hour}
	checked := 0
	for i := 0; i < 3000; i++ {
		alg := algs[r.IntN(len(algs))]
		limit := math.Round(math.Pow(10, r.Float64()*5)) // 1 .. 100,000
		period := []time.Duration{time.Second, 10 * time.Second, time.Minute, time.Hour}[r.IntN(4)]
		burst := 0.0
		if alg == policy.TokenBucket {
			burst = math.Max(1, limit*r.Float64()*3)
		}
		if alg == policy.SlidingLog {
			limit = math.Min(limit, float64(policy.MaxLogEntries))
		}
		p := testPolicy(t, alg, limit, burst, period, 1)
		amount := 1 + r.Int64N(p.Limits().Amount())
		s := ShapeOf(p, amount)
		every := time.Duration(1+r.IntN(10)) * time.Second / time.Duration(1+r.IntN(4))
		b := Assign(s, every, DefaultBurstFraction, Bucket{})
		if b.Deny() {
			continue
		}
		checked++
		if b.FillInterval < time.Second || b.FillInterval%time.Second != 0 || b.TokensPerFill < 1 {
			t.Fatalf("%+v: fill interval must be whole seconds >= 1s and tokens per fill >= 1", b)
		}
		for _, w := range windows {
			if got, ref := b.WorstCase(w, every), s.Reference(w); got > ref*(1+1e-9) {
				t.Fatalf("%s limit %v burst %v period %s share %d (shape %+v), every %s: bucket %+v admits %v in %s, share admits %v",
					alg, limit, burst, period, amount, s, every, b, got, w, ref)
			}
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d shares got a bucket", checked)
	}
}

// A share worth many requests gets most of its rate: what the bucket gives
// up for its starts is δ·P/(P+I) of it (δ of it for a sliding log, which
// also pays for a window's worth, m/P), and rounding at most 1% more.
func TestAssignKeepsMostOfTheRate(t *testing.T) {
	const every = 5 * time.Second
	for _, c := range []struct {
		alg          policy.Algorithm
		limit, burst float64
	}{{policy.TokenBucket, 100, 100}, {policy.TokenBucket, 1000, 50}, {policy.FixedWindow, 600, 0}, {policy.SlidingLog, 200, 0}} {
		p := testPolicy(t, c.alg, c.limit, c.burst, time.Second, 1)
		s := ShapeOf(p, p.Limits().Amount())
		b := Assign(s, every, DefaultBurstFraction, Bucket{})
		given := DefaultBurstFraction * float64(time.Second) / float64(time.Second+every)
		if c.alg == policy.SlidingLog {
			given = DefaultBurstFraction
		}
		if got, want := b.Rate()/s.Rate, 1-given-0.01; got < want || got > 1 {
			t.Errorf("%s %v/s: bucket %+v refills %.3f of the share's rate, want %.3f-1", c.alg, c.limit, b, got, want)
		}
	}
}

// Envoy keeps a bucket whose max_tokens and tokens_per_fill are unchanged
// even when the seconds of its fill interval changed (it compares only the
// nanoseconds), so it would keep the old rate: Assign never changes the
// interval alone.
func TestAssignNeverChangesTheIntervalAlone(t *testing.T) {
	s := Shape{Rate: 20, Burst: 20, Period: 1}
	prev := Assign(s, time.Second, DefaultBurstFraction, Bucket{})
	prev.FillInterval += time.Second // what an earlier share of another rate had
	b := Assign(s, time.Second, DefaultBurstFraction, prev)
	if b.MaxTokens == prev.MaxTokens && b.TokensPerFill == prev.TokensPerFill {
		t.Fatalf("assigned %+v after %+v: Envoy would keep the old rate", b, prev)
	}
	if b.Rate() > s.Rate {
		t.Fatalf("%+v is faster than the share", b)
	}
}

// Nor does Resize, against the bucket the instance may still hold on a
// start and against the policy's fallback (both avoid), whose rate Envoy
// would otherwise keep.
func TestResizeNeverChangesTheIntervalAlone(t *testing.T) {
	s := Shape{Rate: 20, Burst: 20, Period: 1}
	b, _, _ := Resize(s, Bucket{}, 20, 10*time.Second, DefaultBurstFraction)
	for _, avoid := range []Bucket{b, {MaxTokens: b.MaxTokens, TokensPerFill: b.TokensPerFill, FillInterval: time.Second}} {
		avoid.FillInterval += time.Second
		got, _, _ := Resize(s, Bucket{}, 20, 10*time.Second, DefaultBurstFraction, avoid)
		if got.MaxTokens == avoid.MaxTokens && got.TokensPerFill == avoid.TokensPerFill {
			t.Fatalf("sized %+v beside %+v: Envoy would keep the old rate", got, avoid)
		}
	}
}

func TestAssignTooSmallIsDeny(t *testing.T) {
	for _, s := range []Shape{{}, {Rate: 0.001, Burst: 0.001, Period: 1}, {Rate: 0.5, Burst: 0.5, Period: 1}, {Rate: 0.1, Period: 1, Log: true}, {Rate: math.Inf(1), Burst: 1, Period: 1}, {Rate: math.NaN(), Burst: 1, Period: 1}} {
		if b := Assign(s, time.Second, DefaultBurstFraction, Bucket{}); !b.Deny() {
			t.Errorf("shape %+v got %+v, want DENY_ALL", s, b)
		}
	}
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
