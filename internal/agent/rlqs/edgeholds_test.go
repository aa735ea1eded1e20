package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// An agent does not acknowledge a grant smaller than what the region's
// edge reserved for some identity, as long as its view of them is fresh;
// one whose view is stale holds any grant while the edge reserves
// anything.
func TestEdgeHoldsShrinkingGrant(t *testing.T) {
	e := New(Host{Clock: clock.System(), Logger: hclog.NewNullLogger()}, DefaultConfig(), 0, prometheus.NewRegistry())
	api := &policy.Policy{Name: "api", Scope: policy.ScopeGlobal, Edge: &policy.Edge{Instances: 1}}
	read := readOnly{edge.ID{Policy: "api", Identity: "acme"}: {Reserved: 500}}
	e.r = edge.NewRound(e.rc, compareSlots, servesOnly{api}, read, e)
	e.r.SetPolicies([]*policy.Policy{api})
	now := time.Now()
	e.r.WantRead() // as a direct check does: an agent with no bucket at the edge reads only when asked
	e.r.Run(context.Background(), &e.mu, func() time.Time { return now })
	for _, c := range []struct {
		g    lease.Grant
		at   time.Time
		hold bool
	}{
		{lease.Grant{Amount: 400}, now, true},
		{lease.Grant{Amount: 500}, now, false},
		{lease.Grant{Amount: 100, Identities: map[string]int64{"acme": 600}}, now, false},
		{lease.Grant{Amount: 1000}, now.Add(time.Minute), true}, // stale view
	} {
		if got := e.Holds("api", c.g, c.at); got != c.hold {
			t.Errorf("grant %+v at +%s: holds %v, want %v", c.g, c.at.Sub(now), got, c.hold)
		}
	}
	if e.Holds("other", lease.Grant{}, now) {
		t.Error("a policy the edge does not serve is never held")
	}
	if r := e.Reserved("api", "acme", now); r != 500 {
		t.Errorf("direct checks leave %d, want 500", r)
	}
	if r := e.Reserved("api", "acme", now.Add(time.Minute)); r < 1<<62 {
		t.Errorf("a stale view no round read again leaves direct checks %d reserved, want everything", r)
	}
}

// readOnly is a store of edge reservations that holds the others' and
// writes nothing.
type readOnly map[edge.ID]edge.Others

func (r readOnly) Sync(_ context.Context, ws []edge.Write, _ bool, _ time.Duration) (edge.SyncAnswer, error) {
	return edge.SyncAnswer{Granted: make([]edge.Granted, len(ws)), Others: r, Life: 1}, nil
}

// servesOnly is leases of no grant, of one policy served at the edge.
type servesOnly struct{ p *policy.Policy }

func (s servesOnly) Policy(name string) *policy.Policy {
	if name == s.p.Name {
		return s.p
	}
	return nil
}
func (servesOnly) ValidUntil(string) time.Time               { return time.Time{} }
func (servesOnly) EnforceAt(string, string, time.Time) int64 { return 0 }
func (servesOnly) Heir() string                              { return "" }
