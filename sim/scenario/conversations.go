package scenario

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Conversations turns every generated arrival into a conversation: a
// check when it arrives and, if admitted, a charge of Cost after Think.
// Think time and cost are drawn once per arrival, from their own seeded
// stream, so every mode that admitted the check charges the same cost at
// the same time, and the arrivals are those the scenario has without
// conversations. The gateway admits at most the policy's max_in_flight
// conversations of one identity at a time in each mode (0: no cap): an
// arrival beyond it is turned away before its check, which keeps the
// bound's post-hoc term honest.
type Conversations struct {
	Think ThinkTime `yaml:"think"`
	Cost  CostDist  `yaml:"cost"`
}

// ThinkTime is how long a conversation runs between its check and its
// charge: uniform in [Min, Max].
type ThinkTime struct {
	Min policy.Duration `yaml:"min"`
	Max policy.Duration `yaml:"max"`
}

// CostDist is the distribution of a conversation's cost in whole units,
// capped at Max (at most the policy's max_cost) and at least Min (at least
// 1): pareto (scale Min, shape Alpha, default 1.5), lognormal (Median and
// Sigma) or uniform.
type CostDist struct {
	Distribution string  `yaml:"distribution"`
	Min          int64   `yaml:"min"`
	Max          int64   `yaml:"max"`
	Alpha        float64 `yaml:"alpha"`
	Median       float64 `yaml:"median"`
	Sigma        float64 `yaml:"sigma"`
}

func (s *Scenario) defaultConversations() {
	if c := s.Conversations; c != nil && c.Cost.Distribution == "pareto" && c.Cost.Alpha == 0 {
		c.Cost.Alpha = 1.5
	}
}

// validateConversations checks the conversations against the policy: it
// takes charges after the fact, no cost exceeds its max_cost, and the
// traffic is generated (a trace's arrivals carry their cost; the edge's
// Envoy instances do not take charges after the fact here).
func (s *Scenario) validateConversations() error {
	c := s.Conversations
	if c == nil {
		return nil
	}
	p := s.policy
	switch {
	case !p.PostHoc:
		return errors.New("conversations need a policy that takes charges after the fact (post_hoc: true)")
	case s.Trace != "" || s.Edge != nil:
		return errors.New("conversations: with generated traffic or groups only (no trace, no edge)")
	case c.Think.Min < 0 || c.Think.Max < c.Think.Min || time.Duration(c.Think.Max) > time.Hour:
		return fmt.Errorf("conversations: think needs 0 <= min <= max <= 1h, got %s to %s", c.Think.Min, c.Think.Max)
	case c.Cost.Min < 1 || c.Cost.Max < c.Cost.Min || c.Cost.Max > policy.MaxCapacity/policy.Micro:
		return fmt.Errorf("conversations: cost needs 1 <= min <= max <= %d, got %d to %d",
			policy.MaxCapacity/policy.Micro, c.Cost.Min, c.Cost.Max)
	case p.MaxCost > 0 && c.Cost.Max > p.MaxCost:
		return fmt.Errorf("conversations: cost max %d is above the policy's max_cost %d, which the bound counts",
			c.Cost.Max, p.MaxCost)
	}
	switch c.Cost.Distribution {
	case "uniform":
	case "pareto":
		if math.IsNaN(c.Cost.Alpha) || c.Cost.Alpha <= 0 || c.Cost.Alpha > 100 {
			return fmt.Errorf("conversations: pareto alpha must be in (0, 100], got %v", c.Cost.Alpha)
		}
	case "lognormal":
		if math.IsNaN(c.Cost.Median) || c.Cost.Median <= 0 ||
			math.IsNaN(c.Cost.Sigma) || c.Cost.Sigma < 0 || c.Cost.Sigma > 10 {
			return fmt.Errorf("conversations: lognormal needs a positive median and sigma in [0, 10]")
		}
	default:
		return fmt.Errorf("conversations: cost distribution %q; use pareto, lognormal or uniform", c.Cost.Distribution)
	}
	return nil
}

// DrawThink draws a conversation's think time, in ms.
func (c *Conversations) DrawThink(r *rand.Rand) int64 {
	lo, hi := time.Duration(c.Think.Min).Milliseconds(), time.Duration(c.Think.Max).Milliseconds()
	return lo + r.Int64N(hi-lo+1)
}

// DrawCost draws a conversation's cost in whole units, within [Min, Max].
func (c *Conversations) DrawCost(r *rand.Rand) int64 {
	d := c.Cost
	var x float64
	switch d.Distribution {
	case "pareto":
		x = float64(d.Min) / math.Pow(1-r.Float64(), 1/d.Alpha) // 1-U in (0, 1]
	case "lognormal":
		x = d.Median * math.Exp(d.Sigma*r.NormFloat64())
	default:
		x = float64(d.Min) + r.Float64()*float64(d.Max-d.Min)
	}
	return min(d.Max, max(d.Min, int64(math.Round(x))))
}
