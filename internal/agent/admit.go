package agent

import (
	"context"
	"errors"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// This file connects the agent to its admission pipeline: the policies it
// looks requests up in, Redis as the store, and what it counts.

// agentPolicies looks a request's policy up in the agent's set, and asks
// for a reload when a check names one it does not know (perhaps just
// stored).
type agentPolicies struct{ a *Agent }

func (p agentPolicies) Policy(name string) (*policy.Policy, bool) {
	pol, ok := p.a.policies.Policy(name)
	if !ok && name != "" {
		p.a.refreshSoon()
	}
	return pol, ok
}

// timedStore is the regional engine, with the time each Redis call takes
// measured.
type timedStore struct {
	eng *regional.Engine
	m   *metrics
}

func (s timedStore) Decide(ctx context.Context, ts []*admission.Ticket) []admission.Decided {
	t0 := time.Now()
	res := s.eng.Decide(ctx, ts)
	s.m.redisLatency.Observe(time.Since(t0).Seconds())
	return res
}

// observer counts every outcome in the agent's metrics, its demand and its
// hot identities.
type observer struct{ a *Agent }

func (o observer) Observe(t admission.Ticket, out admission.Outcome) {
	if t.Return { // neither a decision nor demand
		o.a.m.observeReturn(t, out)
		return
	}
	a, name := o.a, t.Policy.Name
	demand := admission.Demand(t.Policy, t.Charged(), out.Allowed)
	a.leaser.Observe(name, t.Identity, demand, a.cfg.Clock.Now())
	a.edge.ObserveDirect(name, t.Identity, demand)
	if out.Via == admission.ViaOverLimit {
		a.m.overLimitHits.WithLabelValues(name).Inc()
	}
	if t.Limits.PostHoc && t.Charged() > 0 && (!out.Allowed || out.Shadow) && (out.Via == admission.ViaStore || out.Via == admission.ViaFallback) {
		a.m.overCharged.WithLabelValues(name).Add(float64(t.Charged())) // refused, and counted
	}
	result := "rejected"
	switch {
	case out.Shadow:
		result = "shadow"
	case out.Allowed:
		result = "allowed"
		if out.Mode == lease.ModeDegraded || out.Mode == lease.ModeLocalFallback {
			a.m.budgetAdmits.WithLabelValues(name, string(out.Mode)).Inc()
		}
	}
	a.m.decisions.WithLabelValues(name, string(out.Mode), result).Inc()
	a.hotFor(name).add(t.Identity, t.Cost)
}

func (o observer) Replayed(t admission.Ticket) {
	o.a.m.replays.WithLabelValues(t.Policy.Name).Inc()
}

func (o observer) FellBack(t admission.Ticket, storeErr error, full bool) {
	if errors.Is(storeErr, context.DeadlineExceeded) {
		o.a.m.fallbackAfterTimeout.WithLabelValues(t.Policy.Name).Inc()
	}
	if full {
		o.a.cfg.Logger.Warn("local fallback table full; rejecting new identities", "keys", o.a.cfg.FallbackKeys)
	}
}
