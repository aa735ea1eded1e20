package lease

import (
	"fmt"
	"math"
	"time"
)

// Timing is a lease's timing: the grant terms (ValidFor, DegradedTimeout),
// which the coordinator sets and hands out with every grant, and the clock
// bound (Drift, Margin), which each process sets for itself (an agent takes
// the coordinator's drift when it is larger: Holder.RaiseDrift).
type Timing struct {
	// ValidFor is how long a grant holds.
	ValidFor time.Duration
	// Drift bounds the relative rate error of any clock involved, e.g. 1e-4.
	Drift float64
	// Margin is subtracted on the agent side on top of the drift, to cover
	// scheduling delays between deciding a lease is valid and enforcing.
	Margin time.Duration
	// DegradedTimeout is how long a lapsed region may enforce its degraded
	// budget, and so how long the coordinator keeps it reserved, unless an
	// SRE releases it first. After it, the region admits nothing.
	DegradedTimeout time.Duration
}

// DefaultTiming is a reasonable starting point: 10 s leases, clocks within
// 1e-4, 100 ms margin, degraded budgets kept for 10 minutes.
var DefaultTiming = Timing{
	ValidFor:        10 * time.Second,
	Drift:           1e-4,
	Margin:          100 * time.Millisecond,
	DegradedTimeout: 10 * time.Minute,
}

// Validate reports a timing that cannot be safe.
func (t Timing) Validate() error {
	switch {
	case t.ValidFor <= 0:
		return fmt.Errorf("lease duration must be positive, got %s", t.ValidFor)
	case math.IsNaN(t.Drift) || t.Drift < 0 || t.Drift >= 0.01:
		return fmt.Errorf("clock drift bound must be in [0, 0.01), got %v", t.Drift)
	case t.Margin < 0:
		return fmt.Errorf("lease margin must not be negative, got %s", t.Margin)
	case t.AgentValidFor() <= 0:
		return fmt.Errorf("lease duration %s leaves nothing after drift and margin %s", t.ValidFor, t.Margin)
	case t.DegradedTimeout < 0:
		return fmt.Errorf("degraded timeout must not be negative, got %s", t.DegradedTimeout)
	}
	return nil
}

// driftOf is the most two clocks drifting apart at rate Drift each can
// disagree about an interval of length d, rounded up.
func (t Timing) driftOf(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(2 * t.Drift * float64(d)))
}

// AgentValidFor is how long the agent treats a grant as valid, measured on
// its own clock from the send time of the request: ValidFor less twice the
// drift (agent slow, coordinator fast) and the margin. With agent clock rate
// in [1-ρ, 1+ρ] this ends, in real time, before ValidFor/(1+ρ) after the
// grant, which is the earliest the coordinator's clock can show ValidFor.
func (t Timing) AgentValidFor() time.Duration {
	return t.ValidFor - t.driftOf(t.ValidFor) - t.Margin
}

// AgentDegradedFor is how long, after its own view of expiry, an agent may
// enforce its degraded budget: DegradedTimeout less the drift over it.
func (t Timing) AgentDegradedFor() time.Duration {
	return max(0, t.DegradedTimeout-t.driftOf(t.DegradedTimeout))
}

// RenewAfter is when an agent should renew: at a third of its validity,
// leaving two more attempts before the grant lapses.
func (t Timing) RenewAfter() time.Duration { return t.AgentValidFor() / 3 }
