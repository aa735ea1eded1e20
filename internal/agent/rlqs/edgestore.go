package rlqs

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/regional"
)

// edgeStore is the region's edge reservations in its Redis
// (regional.EdgeStore), with its failures logged as an outage: the first
// at once, then paced, and the recovery. Not safe for concurrent use: the
// rounds sync one at a time.
type edgeStore struct {
	store  *regional.EdgeStore
	now    func() time.Time
	logger hclog.Logger
	down   logs.Outage
}

// Sync syncs with the region's reservations (regional.EdgeStore.Sync).
func (s *edgeStore) Sync(ctx context.Context, writes []edge.Write, read bool,
	alive time.Duration) (edge.SyncAnswer, error) {
	sent := s.now()
	ans, err := s.store.Sync(ctx, writes, read, alive)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, regional.ErrEdgeSweeping) {
			s.down.Failed(s.logger, sent, "error", err)
		}
		return ans, err
	}
	s.down.OK(s.logger, sent)
	return ans, nil
}
