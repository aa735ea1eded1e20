package rlqs

import (
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// Host is what the edge engine uses of the agent around it, given
// at construction.
type Host struct {
	Clock  clock.Clock
	Logger hclog.Logger
	Shared *regional.Region // where the region's edge reservations are
	Leases Leaser
	// Policies is the policy set in force; Asked the same, asking for a
	// reload when a bucket names a policy it does not hold.
	Policies, Asked admission.Policies
	Envoy           func() checkapi.EnvoyIndex // the Envoy index of the policies in force
}

// Leaser is what the edge engine asks of the agent's leases: the
// process it succeeded, what the region may enforce, and the demand the
// edge reports (leaser).
type Leaser interface {
	Succession() (nonce, predecessor string)
	ValidUntil(name string) time.Time
	EnforceAt(name, identity string, at time.Time) (int64, lease.Mode)
	Observe(name, identity string, cost int64, span time.Duration, now time.Time)
}

// edgeLeases is what the edge rounds ask of the agent's policies and
// leases (edge.Leases).
type edgeLeases struct {
	policies admission.Policies
	l        Leaser
}

func (l edgeLeases) Policy(name string) *policy.Policy {
	p, ok := l.policies.Policy(name)
	if !ok || p.Edge == nil || p.Scope != policy.ScopeGlobal {
		return nil
	}
	return p
}

func (l edgeLeases) ValidUntil(name string) time.Time { return l.l.ValidUntil(name) }

func (l edgeLeases) EnforceAt(name, identity string, t time.Time) int64 {
	c, _ := l.l.EnforceAt(name, identity, t)
	return c
}

func (l edgeLeases) Heir() string {
	_, heir := l.l.Succession()
	return heir
}
