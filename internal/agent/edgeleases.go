package agent

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

// edgeHost is what the edge engine uses of the agent around it, given
// at construction.
type edgeHost struct {
	clock  clock.Clock
	logger hclog.Logger
	shared *regional.Region // where the region's edge reservations are
	leases edgeLeaser
	// policies is the policy set in force; asked the same, asking for a
	// reload when a bucket names a policy it does not hold.
	policies, asked admission.Policies
	envoy           func() checkapi.EnvoyIndex // the Envoy index of the policies in force
}

// edgeLeaser is what the edge engine asks of the agent's leases: the
// process it succeeded, what the region may enforce, and the demand the
// edge reports (leaser).
type edgeLeaser interface {
	Succession() (nonce, predecessor string)
	validUntil(name string) time.Time
	EnforceAt(name, identity string, at time.Time) (int64, lease.Mode)
	observe(name, identity string, cost int64, now time.Time)
}

// edgeLeases is what the edge rounds ask of the agent's policies and
// leases (edge.Leases).
type edgeLeases struct {
	policies admission.Policies
	l        edgeLeaser
}

func (l edgeLeases) Policy(name string) *policy.Policy {
	p, ok := l.policies.Policy(name)
	if !ok || p.Edge == nil || p.Scope != policy.ScopeGlobal {
		return nil
	}
	return p
}

func (l edgeLeases) ValidUntil(name string) time.Time { return l.l.validUntil(name) }

func (l edgeLeases) EnforceAt(name, identity string, t time.Time) int64 {
	c, _ := l.l.EnforceAt(name, identity, t)
	return c
}

func (l edgeLeases) Heir() string {
	_, heir := l.l.Succession()
	return heir
}

// validUntil is when this process's grant of policy name stops holding,
// on its clock (zero without one).
func (l *leaser) validUntil(name string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.quotas[name]
	if q == nil {
		return time.Time{}
	}
	g, until := q.a.Grant()
	if g.ID == "" {
		return time.Time{}
	}
	return until
}
