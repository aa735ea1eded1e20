package policy

import "github.com/quota-lease/quota-lease/scale"

// slidingWindow is the sliding window counter transition
// (lua/sliding_window.lua).
//
// The usage of the window ending now is estimated as the current fixed
// window's count plus the previous window's count weighted by how much of
// it still overlaps, rounded up so the estimate never undercounts. Under
// limits that count charges after the fact (Limits.PostHoc) a charge that
// does not fit is counted all the same: the estimate goes over the limit,
// and nothing is admitted until it is back within it (two windows on at
// the latest).
func slidingWindow(s State, l Limits, now, cost int64) (State, Decision) {
	w := l.WindowMs
	if s.Exists && now < s.LastMs {
		now = s.LastMs
	}
	idx := now / w
	prev, count := int64(0), int64(0)
	if s.Exists {
		switch {
		case s.Window >= idx:
			idx, prev, count = s.Window, s.Prev, s.Count
		case s.Window == idx-1:
			prev = s.Count
		}
	}
	elapsed := now - idx*w
	est := scale.Up(prev, w-elapsed, w) + count
	var d Decision
	fits := est+cost <= l.Capacity
	room := l.Capacity - cost // for the retry: what the window must come down to
	if l.counts(fits) {
		added := min(cost, l.Capacity+MaxDebt-count)
		count += added
		est += added
		room = l.Capacity // counted: a check is the next to fit
	}
	if d.Allowed = fits; !fits {
		d.RetryAfterMs = slidingRetry(prev, count, elapsed, room, w)
	}
	d.SetLeft(l.Capacity - est)
	switch {
	case count > 0:
		d.ResetAfterMs = 2*w - elapsed
	case prev > 0:
		d.ResetAfterMs = w - elapsed
	}
	return State{Exists: true, LastMs: now, Window: idx, Prev: prev, Count: count}, d
}

// slidingRetry returns how long until ceil(p*(w-x)/w) + c <= room, for a
// request rejected at offset elapsed into the window with previous and
// current counts prev and count. If the current window alone leaves no room
// the wait runs into the next window, where the current count becomes the
// previous one. The smallest offset is found by binary search over the
// exact estimate, which is monotone in the offset; the Lua script searches
// the same way, so both round identically.
func slidingRetry(prev, count, elapsed, room, w int64) int64 {
	fits := func(p, c, x int64) bool { return scale.Up(p, w-x, w)+c <= room }
	if count <= room {
		return firstFit(elapsed+1, w, func(x int64) bool { return fits(prev, count, x) }) - elapsed
	}
	return w - elapsed + firstFit(0, w, func(x int64) bool { return fits(count, 0, x) })
}

// firstFit returns the smallest x in [lo, hi] with ok(x), given that ok is
// monotone and ok(hi) holds.
func firstFit(lo, hi int64, ok func(int64) bool) int64 {
	for lo < hi {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
