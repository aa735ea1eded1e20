package policy

import (
	"errors"
	"fmt"

	"github.com/quota-lease/quota-lease/scale"
)

// Algorithm names a rate-limiting algorithm a policy can select.
type Algorithm string

// The algorithms a policy can select. TokenBucket is the default.
const (
	// TokenBucket refills Rate micro-units per second up to Capacity.
	TokenBucket Algorithm = "token_bucket"
	// FixedWindow admits Capacity micro-units per aligned window.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindow estimates the last window's usage from the current and
	// previous fixed windows, weighting the previous one by its overlap.
	SlidingWindow Algorithm = "sliding_window"
	// SlidingLog keeps one entry per admitted request in the last window:
	// exact, but memory grows with the limit (at most MaxLogEntries).
	SlidingLog Algorithm = "sliding_log"
)

// MaxLogEntries caps a sliding-log limit (in whole units), because the log
// holds one entry per admitted request.
const MaxLogEntries int64 = 10_000

// Limits are the fixed-point parameters a single decision enforces. They are
// passed to the Lua script on every call rather than stored, so the same key
// can be enforced at a policy's full limit or at a region's leased share.
type Limits struct {
	// Algorithm selects the transition.
	Algorithm Algorithm
	// Capacity is the bucket size (token bucket) or the limit per window
	// (window algorithms), in micro-units.
	Capacity int64
	// Rate is the refill rate of a token bucket in micro-units per second.
	// Unused by the window algorithms.
	Rate int64
	// WindowMs is the window length of the window algorithms.
	// Unused by the token bucket.
	WindowMs int64
	// PostHoc counts every charge, whether or not it fits (a policy that
	// takes charges after the fact, Policy.PostHoc): a charge that does not
	// fit is refused and still counted, so a window's count goes over the
	// limit and a token bucket into debt, and a check (a charge of 0)
	// is refused until the key is back within its limit. Without it a
	// refused charge counts nothing.
	PostHoc bool
}

// ErrInvalidLimits reports limits outside the range the fixed-point
// arithmetic supports.
var ErrInvalidLimits = errors.New("invalid limits")

// Validate reports whether l can be enforced exactly by both the Go and Lua
// transitions.
func (l Limits) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidLimits, fmt.Sprintf(format, args...))
	}
	if l.Capacity < 1 || l.Capacity > MaxCapacity {
		return bad("capacity %d micro-units outside [1, %d]", l.Capacity, MaxCapacity)
	}
	switch l.Algorithm {
	case TokenBucket:
		if l.Rate < 1 || l.Rate > MaxRate {
			return bad("rate %d micro-units/s outside [1, %d]", l.Rate, MaxRate)
		}
		if fill := scale.Up(l.Capacity, 1000, l.Rate); fill > MaxFillMs {
			return bad("an empty bucket would take %d ms to refill, more than %d", fill, MaxFillMs)
		}
	case FixedWindow, SlidingWindow, SlidingLog:
		if l.WindowMs < 1 || l.WindowMs > MaxWindowMs {
			return bad("window %d ms outside [1, %d]", l.WindowMs, MaxWindowMs)
		}
		if l.Algorithm == SlidingLog && l.Capacity > MaxLogEntries*Micro {
			return bad("sliding log limit %d exceeds %d entries", l.Capacity/Micro, MaxLogEntries)
		}
	default:
		return bad("unknown algorithm %q", l.Algorithm)
	}
	return nil
}

// Scale returns the limits for a share of l: capacity and rate multiplied by
// num/den and rounded down, so a share never enforces more than its part.
// A share that rounds to zero returns limits that fail Validate; callers
// treat such a share as "admit nothing".
func (l Limits) Scale(num, den int64) Limits {
	s := l
	s.Capacity = scale.Down(l.Capacity, num, den)
	s.Rate = scale.Down(l.Rate, num, den)
	return s
}

// Amount is the primary quantity of l, the unit in which shares of a
// global quota are counted: the rate of a token bucket (micro-units per
// second), the per-window limit of the window algorithms (micro-units per
// window). This is the one place that rule is written.
func (l Limits) Amount() int64 {
	if l.Algorithm == TokenBucket {
		return l.Rate
	}
	return l.Capacity
}

// Least returns the smallest limits of l's algorithm and window: one
// micro-unit of capacity, refilled (a token bucket) at one micro-unit a
// second. A region without a share counts a charge after the fact on them:
// the charge is refused and still counted, as a debt on the region's own
// key, which its later share repays.
func (l Limits) Least() Limits {
	s := l
	s.Capacity = 1
	if l.Algorithm == TokenBucket {
		s.Rate = 1
	}
	return s
}

// Share returns the limits a region enforces for a share of amount out of
// l, the full limits: rate and capacity scaled together (Scale), rounded
// down. ok is false when the share is too small to admit anything.
func (l Limits) Share(amount int64) (share Limits, ok bool) {
	total := l.Amount()
	if amount >= total {
		return l, true
	}
	if amount <= 0 {
		return Limits{}, false
	}
	share = l.Scale(amount, total)
	return share, share.Validate() == nil
}

// RateAmount converts a rate in micro-units per second (a demand) to l's
// amount unit: itself for a token bucket, per window for the window
// algorithms, the rate counted at most MaxRate (a demand beyond it, a day's
// window of it, would not fit an int64).
func (l Limits) RateAmount(rate int64) int64 {
	if l.Algorithm == TokenBucket {
		return rate
	}
	return scale.Down(min(max(rate, 0), MaxRate), l.WindowMs, 1000)
}

// ttlMs is how long a key must outlive its last write: long enough that a
// key that expires would have been back at its idle state (a full bucket,
// an empty window) anyway.
func (l Limits) ttlMs(marginMs int64) int64 {
	switch l.Algorithm {
	case TokenBucket:
		return scale.Up(l.Capacity, 1000, l.Rate) + marginMs
	case SlidingWindow:
		return 2*l.WindowMs + marginMs
	default:
		return l.WindowMs + marginMs
	}
}

// IdleAfter is how long after its last decision a key in state s under l
// is back at its idle state: IdleMs, but for a token bucket in debt
// (charges after the fact), which refills its debt first. Forgetting the
// key sooner would forgive the debt.
func (l Limits) IdleAfter(s State) int64 {
	if l.Algorithm == TokenBucket && s.Tokens < 0 {
		return scale.Up(l.Capacity-s.Tokens, 1000, l.Rate)
	}
	return l.IdleMs()
}
