package agent

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// This file connects the agent to its admission pipeline: the policies it
// looks requests up in, Redis as the store, and what it counts.

// agentPolicies looks a request's policy up in the agent's set, and asks
// for a reload when a check names one it does not know (perhaps just
// stored).
type agentPolicies struct {
	set     *admission.PolicySet
	refresh func()
}

func (p agentPolicies) Policy(name string) (*policy.Policy, bool) {
	pol, ok := p.set.Policy(name)
	if !ok && name != "" {
		p.refresh()
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

// observer counts every outcome in the agent's metrics, its demand (the
// leases' and the edge's) and its hot identities.
type observer struct {
	m            *metrics
	leaser       *leaser
	edge         *rlqs.Engine
	hot          *hotIdentities
	clock        clock.Clock
	log          hclog.Logger
	fallbackKeys int
}

func (o observer) Observe(t admission.Ticket, out admission.Outcome) {
	if t.Return { // neither a decision nor demand
		o.m.observeReturn(t, out)
		return
	}
	name := t.Policy.Name
	demand := admission.Demand(t.Policy, t.Charged(), out.Allowed)
	o.leaser.Observe(name, t.Identity, demand, 0, o.clock.Now())
	o.edge.ObserveDirect(name, t.Identity, demand)
	if out.Via == admission.ViaOverLimit {
		o.m.overLimitHits.WithLabelValues(name).Inc()
	}
	if t.Limits.PostHoc && t.Charged() > 0 && (!out.Allowed || out.Shadow) &&
		(out.Via == admission.ViaStore || out.Via == admission.ViaFallback) {
		o.m.overCharged.WithLabelValues(name).Add(float64(t.Charged())) // refused, and counted
	}
	result := "rejected"
	switch {
	case out.Shadow:
		result = "shadow"
	case out.Allowed:
		result = "allowed"
		if out.Mode == lease.ModeDegraded || out.Mode == lease.ModeLocalFallback {
			o.m.budgetAdmits.WithLabelValues(name, string(out.Mode)).Inc()
		}
	}
	o.m.decisions.WithLabelValues(name, string(out.Mode), result).Inc()
	o.hot.of(name).add(t.Identity, t.Cost)
}

func (o observer) Replayed(t admission.Ticket) {
	o.m.replays.WithLabelValues(t.Policy.Name).Inc()
}

func (o observer) FellBack(t admission.Ticket, storeErr error, full bool) {
	if errors.Is(storeErr, context.DeadlineExceeded) {
		o.m.fallbackAfterTimeout.WithLabelValues(t.Policy.Name).Inc()
	}
	if full {
		o.log.Warn("local fallback table full; rejecting new identities", "keys", o.fallbackKeys)
	}
}
