package tokens

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// valid is p named "p", per tenant and normalized, failing the test if it
// is not a valid policy.
func valid(t *testing.T, p *policy.Policy) *policy.Policy {
	t.Helper()
	p.Name, p.Identity = "p", []string{"tenant"}
	p.Normalize()
	if err := p.Validate(); err != nil {
		t.Fatalf("policy %+v: %v", p, err)
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
		p := valid(t, &policy.Policy{Algorithm: alg, Limit: limit, Burst: burst, Period: policy.Duration(period), Cost: 1})
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
		p := valid(t, &policy.Policy{Algorithm: c.alg, Limit: c.limit, Burst: c.burst, Period: policy.Duration(time.Second), Cost: 1})
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
