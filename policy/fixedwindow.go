package policy

// fixedWindow is the fixed window transition (lua/fixed_window.lua).
//
// Windows are aligned to multiples of WindowMs on the enforcement clock. A
// rejected request may retry when the next window starts; since cost never
// exceeds the limit, an empty window always admits it. Under limits that
// count charges after the fact (Limits.PostHoc) a charge that does not fit
// is counted all the same, over the limit, as envoyproxy/ratelimit counts
// every hit: the window then refuses every charge and check until it ends.
func fixedWindow(s State, l Limits, now, cost int64) (State, Decision) {
	if s.Exists && now < s.LastMs {
		now = s.LastMs
	}
	idx := now / l.WindowMs
	count := int64(0)
	if s.Exists && s.Window >= idx {
		idx, count = s.Window, s.Count
	}
	end := (idx + 1) * l.WindowMs
	var d Decision
	fits := count+cost <= l.Capacity
	if l.counts(fits) {
		count = min(count+cost, l.Capacity+MaxDebt)
	}
	if d.Allowed = fits; !fits {
		d.RetryAfterMs = end - now
	}
	d.SetLeft(l.Capacity - count) // negative once over: the limit lowered, or charges after the fact
	d.ResetAfterMs = end - now
	return State{Exists: true, LastMs: now, Window: idx, Count: count}, d
}
