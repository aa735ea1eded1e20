package policy

import "github.com/quota-lease/quota-lease/scale"

// tokenBucket is the token bucket transition (lua/token_bucket.lua).
//
// A new key starts full. Refill is elapsed*Rate/1000 rounded down, so at
// most one micro-unit is lost per decision and none is ever minted; once the
// elapsed time covers the whole deficit the bucket is simply full, which
// also keeps the arithmetic small after long idle periods. A rejection
// still persists the refilled tokens and the new time, so the same elapsed
// interval is never counted twice.
//
// Under limits that count charges after the fact (Limits.PostHoc) a charge
// that does not fit takes its cost all the same: the tokens go negative, a
// debt that refill repays before anything is admitted again. The retry
// delay is the same in every case: until the tokens are back at the cost
// (for a charge counted in debt, at zero again).
func tokenBucket(s State, l Limits, now, cost int64) (State, Decision) {
	tokens, last := l.Capacity, now
	if s.Exists {
		tokens, last = s.Tokens, s.LastMs
	}
	if now < last {
		now = last
	}
	if tokens > l.Capacity {
		tokens = l.Capacity
	}
	if missing, elapsed := l.Capacity-tokens, now-last; missing > 0 && elapsed > 0 {
		if elapsed >= scale.Up(missing, 1000, l.Rate) {
			tokens = l.Capacity
		} else {
			tokens += scale.Down(elapsed, l.Rate, 1000)
		}
	}
	var d Decision
	fits := cost <= tokens
	if !fits {
		d.RetryAfterMs = scale.Up(cost-tokens, 1000, l.Rate)
	}
	if l.counts(fits) {
		tokens = max(tokens-cost, -MaxDebt)
	}
	d.Allowed = fits
	d.SetLeft(tokens)
	d.ResetAfterMs = scale.Up(l.Capacity-tokens, 1000, l.Rate)
	return State{Exists: true, LastMs: now, Tokens: tokens}, d
}
