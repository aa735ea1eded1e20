package policy

// fixedWindow is the fixed window transition (lua/fixed_window.lua).
//
// Windows are aligned to multiples of WindowMs on the enforcement clock. A
// rejected request may retry when the next window starts; since cost never
// exceeds the limit, an empty window always admits it.
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
	if count+cost <= l.Capacity {
		count += cost
		d.Allowed = true
	} else {
		d.RetryAfterMs = end - now
	}
	d.Remaining = l.Capacity - count
	if d.Remaining < 0 {
		d.Remaining = 0 // the limit was lowered below what this window used
	}
	d.ResetAfterMs = end - now
	return State{Exists: true, LastMs: now, Window: idx, Count: count}, d
}
