package agent

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// edgeLeases is what the edge rounds ask of the agent's policies and
// leases (edge.Leases).
type edgeLeases struct{ a *Agent }

func (l edgeLeases) Policy(name string) *policy.Policy {
	p, ok := l.a.policies.Policy(name)
	if !ok || p.Edge == nil || p.Scope != policy.ScopeGlobal {
		return nil
	}
	return p
}

func (l edgeLeases) ValidUntil(name string) time.Time { return l.a.leaser.validUntil(name) }

func (l edgeLeases) EnforceAt(name, identity string, t time.Time) int64 {
	c, _ := l.a.leaser.EnforceAt(name, identity, t)
	return c
}

func (l edgeLeases) Heir() string {
	_, heir := l.a.leaser.Succession()
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
