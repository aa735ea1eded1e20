package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// This file models conversations: requests whose cost is known only when
// they end (an LLM's tokens), under a policy that takes charges after the
// fact (policy.Policy.PostHoc, docs/post-hoc.md). Every arrival starts one:
// a check (a charge of 0) in every mode; where the check was admitted, the
// conversation ends after a think time with a charge of its cost in the
// same region, counted whether or not it still fits. What a mode admitted
// is the tokens it charged: the costs of the conversations it let start.

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

// ConversationResult is what one mode did with the conversations.
type ConversationResult struct {
	// Charges and Tokens: the conversations this mode let start and their
	// costs, charged when they ended (the mode's admitted units).
	Charges int64 `json:"charges"`
	Tokens  int64 `json:"tokens"`
	// UncountedTokens are those of Tokens the mode's counter never counted:
	// a charge refused without asking (no share in its region), or a
	// central counter out of reach when the charge was sent.
	UncountedTokens int64 `json:"uncounted_tokens"`
	// InFlightRefused counts arrivals the gateway turned away, before
	// their check: the identity had max_in_flight conversations running.
	InFlightRefused int64 `json:"in_flight_refused"`
	// MaxPeriod is the most one identity was charged within one of the
	// policy's periods, aligned on true time (the central counter's: one
	// delay later), with its identity: for a fixed window, what one
	// counter on that clock counts, at most the limit plus the post-hoc
	// term.
	MaxPeriod         float64 `json:"max_period"`
	MaxPeriodIdentity string  `json:"max_period_identity,omitempty"`
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
		return fmt.Errorf("conversations: cost needs 1 <= min <= max <= %d, got %d to %d", policy.MaxCapacity/policy.Micro, c.Cost.Min, c.Cost.Max)
	case p.MaxCost > 0 && c.Cost.Max > p.MaxCost:
		return fmt.Errorf("conversations: cost max %d is above the policy's max_cost %d, which the bound counts", c.Cost.Max, p.MaxCost)
	}
	switch c.Cost.Distribution {
	case "uniform":
	case "pareto":
		if math.IsNaN(c.Cost.Alpha) || c.Cost.Alpha <= 0 || c.Cost.Alpha > 100 {
			return fmt.Errorf("conversations: pareto alpha must be in (0, 100], got %v", c.Cost.Alpha)
		}
	case "lognormal":
		if math.IsNaN(c.Cost.Median) || c.Cost.Median <= 0 || math.IsNaN(c.Cost.Sigma) || c.Cost.Sigma < 0 || c.Cost.Sigma > 10 {
			return fmt.Errorf("conversations: lognormal needs a positive median and sigma in [0, 10]")
		}
	default:
		return fmt.Errorf("conversations: cost distribution %q; use pareto, lognormal or uniform", c.Cost.Distribution)
	}
	return nil
}

// think draws a conversation's think time, in ms.
func (c *Conversations) think(r *rand.Rand) int64 {
	lo, hi := time.Duration(c.Think.Min).Milliseconds(), time.Duration(c.Think.Max).Milliseconds()
	return lo + r.Int64N(hi-lo+1)
}

// cost draws a conversation's cost in whole units, within [Min, Max].
func (c *Conversations) cost(r *rand.Rand) int64 {
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

// conversing is the engine's state of the conversations in flight.
type conversing struct {
	c   *Conversations
	rng *rand.Rand
	// inFlight[mode][identity] counts conversations checked and not yet
	// charged.
	inFlight []map[int]int64
	cap      int64 // the policy's max_in_flight; 0: none
	// period[mode][identity] is the aligned period being summed and its
	// sum, micro-units.
	period   []map[int][2]int64
	periodMs int64
}

func (e *engine) startConversations() {
	s := e.s
	cv := &conversing{c: s.Conversations, rng: rand.New(rand.NewPCG(s.Seed, 0xc0de)), cap: e.policy.MaxInFlight,
		periodMs: time.Duration(e.policy.Period).Milliseconds()}
	for range e.res.Modes {
		cv.inFlight = append(cv.inFlight, map[int]int64{})
		cv.period = append(cv.period, map[int][2]int64{})
	}
	for _, m := range e.res.Modes {
		m.Conversations = &ConversationResult{}
	}
	e.conv = cv
}

// converse starts arrival a's conversation in every mode, in the order
// arrive decides requests (the ideal limiter first), and schedules its
// charge where the check was admitted.
func (e *engine) converse(a arrival) {
	cv := e.conv
	think, cost := cv.c.think(cv.rng), cv.c.cost(cv.rng)
	a.cost = cost
	idealMode := len(systems)
	admitted := make([]bool, len(e.res.Modes))
	order := append([]int{idealMode}, 0, 1, 2, 3)
	for _, m := range order {
		ok, err := e.startIn(m, a)
		if err != nil {
			e.fail(err)
			return
		}
		admitted[m] = ok
		e.recordCheck(m, ok, admitted[idealMode])
	}
	e.at(e.now+think, func() { e.endConversation(a, admitted) })
}

// startIn is mode's check of a (turned away at the gateway when the
// identity has max_in_flight conversations running there).
func (e *engine) startIn(mode int, a arrival) (bool, error) {
	cv := e.conv
	if cv.cap > 0 && cv.inFlight[mode][a.identity] >= cv.cap {
		e.res.Modes[mode].Conversations.InFlightRefused++
		return false, nil
	}
	ok, _, err := e.chargeIn(mode, a, 0)
	if ok {
		cv.inFlight[mode][a.identity]++
	}
	return ok, err
}

// endConversation charges a's cost in every mode that admitted its check.
func (e *engine) endConversation(a arrival, admitted []bool) {
	for m, ok := range admitted {
		if !ok {
			continue
		}
		e.conv.inFlight[m][a.identity]--
		_, counted, err := e.chargeIn(m, a, a.cost)
		if err != nil {
			e.fail(err)
			return
		}
		at := e.now
		if m == 3 {
			at += e.centralDelay
		}
		e.recordCharge(m, a, at, counted)
	}
}

// chargeIn decides a charge of cost whole units (0: a check) of a in
// mode, as arrive decides a request there: allowed is the answer, counted
// whether the mode's counter counted it (a charge of a post-hoc policy is
// counted when refused too, unless it never reached a counter).
func (e *engine) chargeIn(mode int, a arrival, cost int64) (allowed, counted bool, err error) {
	r := e.regions[a.region]
	micro := cost * policy.Micro
	rms := r.clock(e.now)
	switch mode {
	case 0:
		return e.chargeLeased(r, a, cost)
	case 1:
		return e.decide(r.indep, a.identity, e.full, rms, micro).Allowed, true, nil
	case 2:
		return e.decide(r.static, a.identity, e.full.Scale(1, int64(len(e.regions))), rms, micro).Allowed, true, nil
	case 3:
		if r.partitioned || !e.coordUp {
			return false, false, nil
		}
		return e.decide(e.central, a.identity, e.full, e.now+e.centralDelay, micro).Allowed, true, nil
	default:
		return e.decide(e.oracle, a.identity, e.full, e.now, micro).Allowed, true, nil
	}
}

// chargeLeased decides a check (cost 0) or charge of a in its region's
// admission pipeline, as the agent does: the lease's demand meter sees
// what the ticket asked, and decisions.jsonl has a line for each.
func (e *engine) chargeLeased(r *region, a arrival, cost int64) (allowed, counted bool, err error) {
	o, err := r.admit.Check(context.Background(), admission.Request{Policy: e.policy.Name, Attributes: e.ids.attrs[a.identity], Cost: cost, Check: cost == 0})
	if err != nil {
		return false, false, fmt.Errorf("region %s, identity %s, cost %d: %w", r.name, e.ids.names[a.identity], cost, err)
	}
	e.observe(r, a.identity, admission.Demand(e.policy, cost, o.Allowed))
	if cost == 0 {
		e.res.Modes[0].countMode(string(o.Mode))
	}
	if e.out != nil {
		line := a
		line.cost = cost // 0 for the check
		e.writeDecision(line, o.Decision, string(o.Mode))
	}
	return o.Allowed, o.Via != admission.ViaNoShare, nil
}

// recordCheck counts mode's answer to a conversation's check.
func (e *engine) recordCheck(mode int, allowed, idealAllowed bool) {
	mr := e.res.Modes[mode]
	mr.Requests++
	switch {
	case allowed:
		mr.Admitted++
	case idealAllowed:
		mr.Rejected++
		mr.RejectedWhileFree++
	default:
		mr.Rejected++
	}
}

// recordCharge counts a's charge in mode at atMs: its tokens are what the
// mode admitted, in its windows, its aligned periods and the plots.
func (e *engine) recordCharge(mode int, a arrival, atMs int64, counted bool) {
	cr := e.res.Modes[mode].Conversations
	cr.Charges++
	cr.Tokens += a.cost
	if !counted {
		cr.UncountedTokens += a.cost
	}
	micro := a.cost * policy.Micro
	e.observeWindow(mode, atMs, e.track[e.res.Modes[mode].Mode].add(a.identity, atMs, micro))
	e.series.add(mode, a.region, a.identity, atMs, a.cost)
	cv := e.conv
	p := cv.period[mode][a.identity]
	if k := atMs / cv.periodMs; p[0] != k {
		p = [2]int64{k, 0}
	}
	p[1] += micro
	cv.period[mode][a.identity] = p
	if v := policy.Units(p[1]); v > cr.MaxPeriod {
		cr.MaxPeriod, cr.MaxPeriodIdentity = v, e.ids.names[a.identity]
	}
}
