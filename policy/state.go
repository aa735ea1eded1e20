package policy

import (
	"errors"
	"fmt"
)

// State is the persisted state of one key, field for field what the Lua
// scripts keep in Redis. The zero State is a key that does not exist.
type State struct {
	// Exists is false for a key never written or expired.
	Exists bool
	// LastMs is the latest time the key has seen; time never goes back
	// behind it, so a clock stepping backward mints nothing.
	LastMs int64
	// Tokens is the token bucket's content in micro-units.
	Tokens int64
	// Window is the index (now / WindowMs) of the current window.
	Window int64
	// Count is the usage charged in the current window, in micro-units.
	Count int64
	// Prev is the usage of the previous window (sliding window counter).
	Prev int64
	// Log holds the sliding log's admitted requests, oldest first.
	Log []LogEntry
	// Sum is the total cost in Log.
	Sum int64
	// Held is, for a policy that accepts returns, the micro-units
	// admitted and not yet returned (ApplyHeld, Return): what a return
	// is matched against.
	Held int64
	// Refused is, for a policy that accepts returns, the micro-units of
	// charges it refused whose returns may still come (ApplyHeld):
	// Envoy returns a request's hits at its end whether or not they were
	// admitted, and such a return must free nothing.
	Refused int64
	// Unrefilled is, for a token bucket that accepts returns, the
	// micro-units its charges took that refill has not yet restored
	// (refill taken to restore the oldest first): the part of its deficit
	// a return may free, the rest being capacity a grown share has not
	// yet filled.
	Unrefilled int64
}

// LogEntry is one admitted request in a sliding log.
type LogEntry struct {
	AtMs int64 // when it was admitted
	Cost int64 // micro-units
}

// MaxTimeMs is the largest time a transition accepts (about year 2248).
const MaxTimeMs int64 = 1 << 43

// ErrInvalidCost reports a cost that is not positive.
var ErrInvalidCost = errors.New("cost must be a positive number of units")

// ErrCostExceedsCapacity reports a cost larger than the capacity: such a
// request can never be admitted, however long the caller waits, so no retry
// delay is given.
var ErrCostExceedsCapacity = errors.New("cost exceeds capacity: the request can never be admitted")

// MaxDebt is the most a key may be over its limit, in micro-units: what
// keeps a token bucket's deficit and a window's estimate within the exact
// range of the Lua arithmetic (below 2^53). A charge after the fact
// (Limits.PostHoc) that would take a key further is counted up to it.
const MaxDebt int64 = 2 * MaxCapacity

// Apply is the pure transition of one decision: from the key's state s at
// time nowMs, charge cost micro-units under limits l. It returns the state
// to persist and the decision. It performs exactly the arithmetic of the
// Lua scripts; invalid input returns an error and s unchanged.
//
// A cost of 0 is a check (Envoy's hits_addend 0): it charges nothing and
// is admitted while the key is within its limit, as envoyproxy/ratelimit
// answers it (over only once the count exceeds the limit). Under limits
// that count charges after the fact (Limits.PostHoc) a cost may exceed the
// capacity: such a charge is refused and counted.
func Apply(s State, l Limits, nowMs, cost int64) (State, Decision, error) {
	if err := l.Validate(); err != nil {
		return s, Decision{}, err
	}
	if nowMs < 0 || nowMs > MaxTimeMs {
		return s, Decision{}, fmt.Errorf("time %d ms outside [0, %d]", nowMs, MaxTimeMs)
	}
	if err := l.CheckCost(cost); err != nil {
		return s, Decision{}, err
	}
	ns, d := transition(s, l, nowMs, cost)
	return ns, d, nil
}

// CheckCost reports why a charge of cost micro-units can never be decided
// under l: a negative cost, one above MaxCapacity, or, unless l counts
// charges after the fact, one above the capacity (which could never be
// admitted). 0, a check, is always valid.
func (l Limits) CheckCost(cost int64) error {
	switch {
	case cost < 0 || cost > MaxCapacity:
		return fmt.Errorf("%w: %d micro-units outside [0, %d]", ErrInvalidCost, cost, MaxCapacity)
	case cost > l.Capacity && !l.PostHoc:
		return ErrCostExceedsCapacity
	}
	return nil
}

// transition is l's algorithm's transition, on valid arguments. A cost of
// 0 is a check (Apply); Return uses it to bring s to nowMs.
func transition(s State, l Limits, nowMs, cost int64) (State, Decision) {
	switch l.Algorithm {
	case TokenBucket:
		return tokenBucket(s, l, nowMs, cost)
	case FixedWindow:
		return fixedWindow(s, l, nowMs, cost)
	case SlidingWindow:
		return slidingWindow(s, l, nowMs, cost)
	default: // SlidingLog; Validate rejected anything else
		return slidingLog(s, l, nowMs, cost)
	}
}

// counts reports whether a charge that fits or not is counted under l:
// every charge after the fact is; a refused one otherwise is not.
func (l Limits) counts(fits bool) bool { return fits || l.PostHoc }

// Holding returns the state of a key that, at nowMs, has fraction frac (in
// [0, 1]) of l's capacity left, as if the rest had just been used: a
// token bucket with that many tokens, a window (or log) already charged
// the rest at nowMs. Starting a key there instead of at the zero State (a
// full bucket, an empty window) is how a limiter that cannot know what was
// already admitted (a local fallback, a store that lost its state) avoids
// minting a fresh burst. l must be valid.
func Holding(l Limits, nowMs int64, frac float64) State {
	frac = max(0, min(1, frac))
	left := int64(float64(l.Capacity) * frac) // rounded down: never more than frac
	used := l.Capacity - left
	switch l.Algorithm {
	case TokenBucket:
		return State{Exists: true, LastMs: nowMs, Tokens: left}
	case SlidingLog:
		s := State{Exists: true, LastMs: nowMs}
		if used > 0 {
			s.Log, s.Sum = []LogEntry{{AtMs: nowMs, Cost: used}}, used
		}
		return s
	default: // fixed and sliding windows: the current window used the rest
		return State{Exists: true, LastMs: nowMs, Window: nowMs / l.WindowMs, Count: used}
	}
}

// Fresh is the state a key that its store does not hold starts from at
// nowMs, given when the store's memory began (bornMs; 0 for a store taken
// as new, see Engine.InitStore).
//
// In a store born at least the limits' IdleMs ago a missing key was either
// never used or idle long enough to be back at the zero State, so it starts
// there: a full bucket, an empty window. In a younger store the key may
// have been lost with the store's memory (a restart without persistence)
// while it held less, so it starts as if it had used all of its limits the
// moment the store was born: a token bucket refills from empty since then,
// a window admits nothing more before the window of the birth has passed.
// So a store that forgets everything mints no burst. The scripts do the
// same with the store's marker key.
func Fresh(l Limits, nowMs, bornMs int64) State {
	if bornMs > 0 && nowMs-bornMs < l.IdleMs() {
		return Holding(l, bornMs, 0)
	}
	return State{}
}

// IdleMs is how long after its last decision a key under l is back at the
// zero State's position (a full bucket, an empty window) whatever it held:
// a key idle for longer can be forgotten without changing any decision.
func (l Limits) IdleMs() int64 { return l.ttlMs(0) }
