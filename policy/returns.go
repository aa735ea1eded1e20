package policy

import "fmt"

// Returns: a request of a policy that accepts them (Policy.Returns) may
// give back what it took when it ends (Envoy's is_negative_hits, sent by a
// rate limit applied on stream done). A return carries no record of the
// charge it gives back (no time, no id), only the identity and the units,
// so it is matched against what the identity holds, the units admitted
// and not yet returned (State.Held, which ApplyHeld keeps), and never
// gives back more than that: a return that matches nothing frees nothing.
//
// Envoy sends a request's return at its end whether or not its hits were
// admitted (Filter::onDestroy in source/extensions/filters/http/ratelimit/
// ratelimit.cc sends the descriptors applied on stream done once the call
// completed, OK or OVER_LIMIT), and quota-lease never charges a refused
// request. So a refused charge is recorded too (State.Refused), and a
// return is matched first against those, freeing nothing: taking a return
// for an admitted request's when it was a refused one's could free units
// another request still holds; the other way round only frees them late.
//
// Of the units it matches, a return frees only the part the algorithm
// still counts, taking the returned units to be the oldest the identity
// holds: of everything it could be, that frees the least, because what an
// older charge took is the first to leave a window or be refilled. So
// after any returns the state counts at least what it would count had the
// returned requests never been admitted (tested against that replay for
// every algorithm and order of returns, the share changing), and, but for
// the token bucket, exactly that when requests return in the order they
// were admitted and none was refused:
//
//   - fixed window: the units held beyond the current window's count were
//     taken in earlier windows, which no longer limit anything: a return
//     clears those first and frees the rest from the current window's
//     count;
//   - sliding window counter: first what is older than the previous
//     window, then the previous window's count (which the estimate
//     weighs by its overlap), then the current one's;
//   - sliding log: first what has left the log, then the oldest entries;
//   - token bucket: refill is taken to restore what the oldest charges
//     took first, so of what is held, what refill restored since is
//     already back; a return frees the rest, as tokens (never above the
//     capacity). The bucket keeps what its charges took and refill has
//     not restored (State.Unrefilled): its deficit alone would count the
//     capacity a grown share has not filled yet as taken. Not exact: a
//     unit held long frees less than it would had refill restored the
//     other charges first.

// MaxHeld is where State.Held and State.Refused saturate: far above any
// capacity plus any return (MaxCapacity each), so a saturated ledger
// still matches every return to units older than anything the state
// counts and frees nothing it should not.
const MaxHeld int64 = 1 << 52

// ApplyHeld is Apply for a policy that accepts returns: an admitted cost
// is also recorded in the state's Held, a refused one in its Refused
// (saturating at MaxHeld), for returns to be matched against.
func ApplyHeld(s State, l Limits, nowMs, cost int64) (State, Decision, error) {
	ns, d, err := Apply(s, l, nowMs, cost)
	if err != nil {
		return ns, d, err
	}
	charged := int64(0)
	if d.Allowed {
		charged = cost
	}
	ns.Held, ns.Refused = min(MaxHeld, s.Held+charged), s.Refused
	if !d.Allowed {
		ns.Refused = min(MaxHeld, s.Refused+cost)
	}
	if l.Algorithm == TokenBucket {
		ns.Unrefilled = unrefilled(s, ns, l, charged)
	}
	return ns, d, nil
}

// unrefilled is what a token bucket's charges took that refill has not
// restored, once its state went from s to ns charging charged: s's less
// the refill between, which restores the oldest first, plus charged; and
// never more than ns's deficit, which bounds what any charges can still
// be missing from it (a shrinking capacity cuts tokens a charge took
// before refill could). A state that did not exist has none before.
func unrefilled(s, ns State, l Limits, charged int64) int64 {
	u := charged
	if s.Exists {
		refill := ns.Tokens + charged - min(l.Capacity, s.Tokens)
		u += max(0, s.Unrefilled-refill)
	}
	return min(u, l.Capacity-ns.Tokens)
}

// Return gives back units micro-units (1 to MaxCapacity) of what the
// identity of state s took under limits l, at nowMs; see the top of this
// file. The decision is allowed, with what remains after the return;
// Matched and Freed say what it matched and freed. A state that does not
// exist holds nothing: it is left as it is, nothing matched. Invalid input
// returns an error and s unchanged.
func Return(s State, l Limits, nowMs, units int64) (State, Decision, error) {
	if err := l.Validate(); err != nil {
		return s, Decision{}, err
	}
	if nowMs < 0 || nowMs > MaxTimeMs {
		return s, Decision{}, fmt.Errorf("time %d ms outside [0, %d]", nowMs, MaxTimeMs)
	}
	if units < 1 || units > MaxCapacity {
		return s, Decision{}, fmt.Errorf("%w: a return of %d micro-units is outside [1, %d]",
			ErrInvalidCost, units, MaxCapacity)
	}
	if !s.Exists {
		return s, Decision{Allowed: true, Remaining: l.Capacity}, nil
	}
	held := s.Held
	ns, _ := transition(s, l, nowMs, 0) // brought to now, nothing charged
	if l.Algorithm == TokenBucket {
		ns.Unrefilled = unrefilled(s, ns, l, 0)
	}
	refused := min(units, s.Refused) // a refused request's return: frees nothing
	matched := min(units-refused, held)
	freed := free(&ns, l, held, matched)
	ns.Held, ns.Refused = held-matched, s.Refused-refused
	after, d := transition(ns, l, nowMs, 0) // what remains, as a charge would see it
	after.Held, after.Refused, after.Unrefilled = ns.Held, ns.Refused, ns.Unrefilled
	d.Allowed, d.RetryAfterMs, d.Matched, d.Freed = true, 0, refused+matched, freed
	return after, d, nil
}

// free frees, in s (brought to now), the part of matched, micro-units of
// held that a return matched, that s still counts, taking it to be the
// oldest held; it returns the micro-units freed.
func free(s *State, l Limits, held, matched int64) int64 {
	// counted is the part of matched s still counts, where s counts c of
	// what the identity holds: the rest of held was taken longer ago than
	// s remembers (or is refilled), and the oldest is matched first.
	counted := func(c int64) int64 { return matched - min(matched, max(0, held-c)) }
	switch l.Algorithm {
	case TokenBucket:
		f := counted(s.Unrefilled)
		s.Tokens += f
		s.Unrefilled -= f
		return f
	case FixedWindow:
		f := counted(s.Count)
		s.Count -= f
		return f
	case SlidingWindow:
		r := counted(s.Count + s.Prev)
		fp := min(r, s.Prev)
		fc := min(r-fp, s.Count)
		s.Prev -= fp
		s.Count -= fc
		return fp + fc
	default: // SlidingLog: the oldest entries first
		r := counted(s.Sum)
		f := r
		log := s.Log[:0:0]
		for _, e := range s.Log {
			take := min(r, e.Cost)
			r -= take
			if e.Cost -= take; e.Cost > 0 {
				log = append(log, e)
			}
		}
		s.Log, s.Sum = log, s.Sum-(f-r)
		return f - r
	}
}
