package policy

import (
	"fmt"

	"github.com/quota-lease/quota-lease/scale"
)

// Reservations: a request whose cost is known only when it ends (a policy
// that takes charges after the fact) may reserve an estimate when it
// starts and settle the actual cost when it ends. The reservation is an
// ordinary charge of the estimate: admitted only if it fits, counted only
// when admitted. The settlement charges what the actual cost exceeds the
// estimate by, counted whether or not it fits (as every charge after the
// fact is), or gives back what the estimate exceeded it by. So what is
// charged beyond the limit is the estimates' error on the requests in
// flight, not their whole cost.
//
// A give-back frees only what the key still counts of the reservation,
// never more than a replay without the given-back units would have left:
//
//   - fixed window: from the reservation's window, if that is still the
//     current one (an earlier window no longer limits anything);
//   - sliding window counter: from the current or the previous window,
//     whichever counted the reservation;
//   - sliding log: from the reservation's entry, while it is in the log;
//   - token bucket: the units less what refill has added since the
//     reservation (refill is capped at the capacity, so a replay without
//     them may have lost up to that much to the cap), never above the
//     capacity.

// Reserved is what a reservation took: its cost in micro-units and the
// time its charge counted at (the decision's time, held to the key's
// latest: State.LastMs after it).
type Reserved struct {
	Cost int64
	AtMs int64
}

// Settle settles reservation r of the key in state s at nowMs with the
// request's actual cost (micro-units, 0 to MaxCapacity): above r.Cost the
// difference is charged, counted whether or not it fits, and the decision
// is that charge's; below it the difference is given back as the top of
// this file says, and the decision is allowed, with what remains.
// Invalid input returns an error and s unchanged.
func Settle(s State, l Limits, nowMs int64, r Reserved, actual int64) (State, Decision, error) {
	if err := l.Validate(); err != nil {
		return s, Decision{}, err
	}
	if nowMs < 0 || nowMs > MaxTimeMs {
		return s, Decision{}, fmt.Errorf("time %d ms outside [0, %d]", nowMs, MaxTimeMs)
	}
	if actual < 0 || actual > MaxCapacity || r.Cost < 0 || r.Cost > MaxCapacity {
		return s, Decision{}, fmt.Errorf("%w: a settlement of %d micro-units for %d reserved, outside [0, %d]",
			ErrInvalidCost, actual, r.Cost, MaxCapacity)
	}
	if actual > r.Cost {
		l.PostHoc = true
		ns, d := transition(s, l, nowMs, actual-r.Cost)
		return ns, d, nil
	}
	ns, _ := transition(s, l, nowMs, 0) // brought to now
	giveBack(&ns, l, r, r.Cost-actual)
	ns, d := transition(ns, l, nowMs, 0)
	d.Allowed, d.RetryAfterMs = true, 0
	return ns, d, nil
}

// giveBack frees, in s (brought to now), up to u micro-units of
// reservation r, as the top of this file says.
func giveBack(s *State, l Limits, r Reserved, u int64) {
	if u <= 0 {
		return
	}
	switch l.Algorithm {
	case FixedWindow:
		if r.AtMs/l.WindowMs == s.Window {
			s.Count -= min(u, s.Count)
		}
	case SlidingWindow:
		switch r.AtMs / l.WindowMs {
		case s.Window:
			s.Count -= min(u, s.Count)
		case s.Window - 1:
			s.Prev -= min(u, s.Prev)
		}
	case SlidingLog:
		for i, e := range s.Log {
			if e.AtMs == r.AtMs && e.Cost == r.Cost {
				s.Log = append([]LogEntry(nil), s.Log...) // s.Log may be shared
				s.Log[i].Cost -= u
				if s.Log[i].Cost == 0 {
					s.Log = append(s.Log[:i], s.Log[i+1:]...)
				}
				s.Sum -= u
				return
			}
		}
	case TokenBucket:
		refilled := scale.Up(max(0, s.LastMs-r.AtMs), l.Rate, 1000)
		if free := min(u-refilled, l.Capacity-s.Tokens); free > 0 {
			s.Tokens += free
		}
	}
}
