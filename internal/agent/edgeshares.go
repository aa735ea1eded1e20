package agent

import (
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
	"github.com/quota-lease/quota-lease/lease"
)

// edgeShares is the admission pipeline's Shares: what the leases let the
// region enforce, less what the region's agents reserved of it for Envoy
// instances (rlqs.Engine.Reserved). Every direct check (HTTP, gRPC, Envoy's
// RLS) and the local fallback take their limits from it, so the edge's
// part is left out in this one place.
type edgeShares struct {
	l *leaser
	e *rlqs.Engine
}

func (s edgeShares) Enforce(name, identity string, now time.Time) (int64, lease.Mode) {
	amount, mode := s.l.Enforce(name, identity, now)
	if amount <= 0 {
		return amount, mode
	}
	return edge.DirectShare(amount, s.e.Reserved(name, identity, now)), mode
}

func (s edgeShares) Instances() int { return s.l.Instances() }
