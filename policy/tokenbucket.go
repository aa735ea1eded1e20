package policy

// tokenBucket is the token bucket transition (lua/token_bucket.lua).
//
// A new key starts full. Refill is elapsed*Rate/1000 rounded down, so at
// most one micro-unit is lost per decision and none is ever minted; once the
// elapsed time covers the whole deficit the bucket is simply full, which
// also keeps the arithmetic small after long idle periods. A rejection
// still persists the refilled tokens and the new time, so the same elapsed
// interval is never counted twice.
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
		if elapsed >= mulDiv(missing, 1000, l.Rate, true) {
			tokens = l.Capacity
		} else {
			tokens += mulDiv(elapsed, l.Rate, 1000, false)
		}
	}
	var d Decision
	if cost <= tokens {
		tokens -= cost
		d.Allowed = true
	} else {
		d.RetryAfterMs = mulDiv(cost-tokens, 1000, l.Rate, true)
	}
	d.Remaining = tokens
	d.ResetAfterMs = mulDiv(l.Capacity-tokens, 1000, l.Rate, true)
	return State{Exists: true, LastMs: now, Tokens: tokens}, d
}
