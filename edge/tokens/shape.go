package tokens

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Shape is what a share of a policy may admit, in requests (each Envoy
// request takes one token): at most Burst + Rate×w in any window of length
// w, or, for a sliding log (Log), at most Rate×Period per period it
// touches. Period is the policy's window, or for a token bucket the time
// its burst takes to refill.
type Shape struct {
	Rate   float64 // requests per second
	Burst  float64 // requests
	Period float64 // seconds
	Log    bool
}

// ShapeOf returns the shape of a share of amount (the policy's amount
// unit, policy.Limits.Amount) of p, for requests of p's default cost.
func ShapeOf(p *policy.Policy, amount int64) Shape {
	l := p.Limits()
	total := l.Amount()
	if amount <= 0 || total <= 0 {
		return Shape{}
	}
	amount = min(amount, total)
	s := l.Scale(amount, total)
	cost := float64(p.Cost) * float64(policy.Micro)
	if l.Algorithm == policy.TokenBucket {
		r, b := float64(s.Rate)/cost, float64(s.Capacity)/cost
		if r <= 0 {
			return Shape{}
		}
		return Shape{Rate: r, Burst: b, Period: b / r}
	}
	period := float64(l.WindowMs) / 1000
	c := float64(s.Capacity) / cost
	sh := Shape{Rate: c / period, Burst: c, Period: period}
	if l.Algorithm == policy.SlidingLog {
		sh.Burst, sh.Log = 0, true
	}
	return sh
}

// Reference is the most the share admits in any window of length w (for
// a sliding log, per whole periods the window touches, as bound.Reference
// counts the whole limit).
func (s Shape) Reference(w time.Duration) float64 {
	if s.Log {
		n := w.Seconds() / s.Period
		if n != float64(int64(n)) {
			n = float64(int64(n) + 1)
		}
		return s.Rate * s.Period * max(1, n)
	}
	return s.Burst + s.Rate*w.Seconds()
}
