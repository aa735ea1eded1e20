package agent

import (
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/lease"
)

// edgeShares is the admission pipeline's Shares: what the leases let the
// region enforce, less what the region's agents reserved of it for Envoy
// instances (edgeEngine.reserved). Every direct check (HTTP, gRPC, Envoy's
// RLS) and the local fallback take their limits from it, so the edge's
// part is left out in this one place.
type edgeShares struct {
	l *leaser
	e *edgeEngine
}

func (s edgeShares) Enforce(name, identity string, now time.Time) (int64, lease.Mode) {
	amount, mode := s.l.Enforce(name, identity, now)
	if amount <= 0 {
		return amount, mode
	}
	return edge.DirectShare(amount, s.e.reserved(name, identity, now)), mode
}

func (s edgeShares) Instances() int { return s.l.Instances() }
