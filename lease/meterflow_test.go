package lease

import (
	"math/rand/v2"
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// Four instances of one identity report every 5 s, each at its own phase,
// what they were asked since their last report, 20 a second each: the
// identity's rate (Rates) and the region's (Rate) read as 80 a second
// within a tenth, read every 100 ms over a minute, counting each report as
// a flow over its span. Counted whole on arrival, as a check is, the same
// reports read as little as two thirds of the rate.
func TestMeterReportsReadAsTheirRate(t *testing.T) {
	const start, rate = 1_000_000, 80 // ms; requests a second, over 4 instances
	for _, flows := range []bool{true, false} {
		m := NewMeter[string](MeterTracks(0))
		rng := rand.New(rand.NewPCG(3, 4))
		next := make([]int64, 4) // each instance's next report, ms
		for i := range next {
			next[i] = start + rng.Int64N(5000)
		}
		lo, hi := float64(1<<62), 0.0
		var counted int64
		for now := int64(start); now < start+70_000; now += 100 {
			for i, at := range next {
				if at > now {
					continue
				}
				cost := int64(rate/4*5) * policy.Micro // 5 s of 20 a second
				span := int64(5000)
				if !flows {
					span = 0
				}
				m.Add("tenant=a", cost, span, at)
				counted += cost
				next[i] = at + 5000
			}
			if now < start+20_000 {
				continue // the meter's four buckets fill
			}
			r := float64(m.Rates(now, 0, func(string) bool { return true })["tenant=a"]) / float64(policy.Micro)
			d := float64(m.Rate(now)) / float64(policy.Micro)
			lo, hi = min(lo, r, d), max(hi, r, d)
		}
		within := lo >= 0.9*rate && hi <= 1.1*rate
		if flows && !within {
			t.Errorf("reports counted as flows read %.1f to %.1f a second, want %d within a tenth", lo, hi, rate)
		}
		if !flows && within {
			t.Errorf("reports counted whole read %.1f to %.1f a second: the test cannot tell flows from them", lo, hi)
		}
	}
}

// A flow counts its whole cost by its end, and a report over longer than
// the meter keeps (four buckets) keeps its rate: what falls beyond is not
// counted.
func TestMeterFlowCountsItsCost(t *testing.T) {
	const start = 1_000_000
	m := NewMeter[string](MeterTracks(0))
	m.Add("a", 7*policy.Micro, 3000, start+100) // 7 over 3 s
	if got := m.Rates(start+3100, 0, func(string) bool { return true })["a"]; got != 7*policy.Micro*1000/3000 {
		t.Fatalf("a flow of 7 over 3 s, read 3 s after: %d a second, want all 7 over the 3 s the meter has run", got)
	}
	m.Add("b", 60*policy.Micro, 60_000, start+3100) // 1 a second over a minute
	if got := m.Rates(start+8100, 0, func(string) bool { return true })["b"]; got != 5*policy.Micro*1000/8000 {
		t.Fatalf("a minute's report read 5 s after: %d a second, want 5 counted over the meter's 8 s", got)
	}
}
