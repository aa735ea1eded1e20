package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// This file models conversations: requests whose cost is known only when
// they end (an LLM's tokens), under a policy that takes charges after the
// fact (policy.Policy.PostHoc, docs/post-hoc.md). Every arrival starts one:
// a check (a charge of 0) in every mode; where the check was admitted, the
// conversation ends after a think time with a charge of its cost in the
// same region, counted whether or not it still fits. What a mode admitted
// is the tokens it charged: the costs of the conversations it let start.

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

// conversing is the engine's state of the conversations in flight.
type conversing struct {
	c   *scenario.Conversations
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
	think, cost := cv.c.DrawThink(cv.rng), cv.c.DrawCost(cv.rng)
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
	o, err := r.admit.Check(context.Background(), admission.Request{
		Policy:     e.policy.Name,
		Attributes: e.ids.attrs[a.identity],
		Cost:       cost,
		Check:      cost == 0,
	})
	if err != nil {
		return false, false, fmt.Errorf("region %s, identity %s, cost %d: %w", r.name, e.ids.names[a.identity], cost, err)
	}
	e.observe(r, a.identity, admission.Demand(e.policy, cost, o.Allowed), 0)
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
