package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Span is the time a usage report's count of requests (allowed and
// denied) is a rate over: elapsed, the report's time_elapsed, when it has
// a part of a second (the client library measures it on its own clock,
// free of the network's and the agent's delays); else measured, the time
// since the same bucket's previous report on the stream as the agent
// received them, when known; else elapsed. Envoy sends whole seconds there
// (0 on a bucket's first report, 4s for 4.99s), so from Envoy it is used
// only when at least a second and nothing better is known. ok is false
// when nothing says anything.
func Span(elapsed, measured time.Duration) (d time.Duration, ok bool) {
	switch {
	case elapsed > 0 && elapsed%time.Second != 0:
		return elapsed, true
	case measured > 0:
		return measured, true
	case elapsed >= time.Second:
		return elapsed, true
	}
	return 0, false
}

// firstSpan is the least time a slot's first known rate is measured
// over: a report over less is added to the next.
const firstSpan = time.Second

// demandWindow is about how long a span of reports a slot's rate (and of
// measures the direct checks' rate) stands for. A report over less, as a
// client reporting every second sends, moves the rate toward its own in
// proportion to the time it covers (a moving average over about this
// long), so that the chance gaps and clusters of a few requests do not
// shrink and grow an instance's share from one second to the next: at 2
// requests a second, one second in seven has none. A count chance cannot
// explain (demand that moved) and Envoy's 5 s reports are taken whole.
// docs/simulator.md measures what this gives clients that report every
// second or two.
const demandWindow = 3 * time.Second

// averaged is the request rate after a report of count requests over d,
// the rate before it being last (negative: unknown).
func averaged(last float64, count uint64, d time.Duration) float64 {
	r := float64(count) / d.Seconds()
	if last < 0 || d >= demandWindow {
		return r
	}
	// Poisson arrivals at the last rate would count expect, give or take
	// its square root: a count more than three of those (and a few
	// requests) away is a change, not chance.
	expect := last * d.Seconds()
	if math.Abs(float64(count)-expect) > 3*math.Sqrt(expect)+3 {
		return r
	}
	w := d.Seconds() / demandWindow.Seconds()
	return w*r + (1-w)*last
}

// DemandAmount converts a rate of requests per second of p into p's
// amount unit, as the lease protocol counts demand.
func DemandAmount(p *policy.Policy, perSecond float64) int64 {
	micro := perSecond * float64(p.Cost) * float64(policy.Micro)
	if micro >= float64(policy.MaxRate) {
		micro = float64(policy.MaxRate)
	}
	if micro <= 0 {
		return 0
	}
	return p.Limits().RateAmount(int64(micro))
}
