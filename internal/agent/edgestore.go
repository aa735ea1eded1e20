package agent

import (
	"context"
	"errors"
	"github.com/hashicorp/go-hclog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
)

// edgeStore is the region's edge reservations in its Redis, as the edge
// rounds sync with them (edge.Store): this agent's writes (edgeWrite) and
// the other agents' holdings (edgeReader). Not safe for concurrent use:
// the rounds sync one at a time.
type edgeStore struct {
	rdb      redis.UniversalClient
	region   string
	self     func() edgeAgent // this agent process, and the one it succeeded
	now      func() time.Time
	trust    time.Duration // the most a read may take (edge.Config.Trust)
	growWait time.Duration // the most the writes may take after it
	logger   hclog.Logger
	down     outage
	reader   *edgeReader // made at the first sync, for this agent's id
}

// Sync reads the other agents' reservations when read, then writes
// writes. The read may take as long as it may be trusted
// (edge.Config.Trust: it counts from when it was sent); the writes get
// GrowWait after it.
func (s *edgeStore) Sync(ctx context.Context, writes []edge.Write, read bool) ([]edge.Granted, map[edge.ID]edge.Others, error) {
	sent := s.now()
	agent := s.self()
	if s.reader == nil {
		s.reader = newEdgeReader(agent.id, s.now)
	}
	// The read first: it is trusted from sent, so however long the writes
	// take, it does not age while they run (the script's growth rule counts
	// whatever the others wrote since).
	var others map[edge.ID]edge.Others
	var readErr error
	if read {
		rctx, cancel := context.WithTimeout(ctx, s.trust)
		others, readErr = s.reader.read(rctx, s.rdb, s.region, agent)
		cancel()
	}
	wctx, cancel := context.WithTimeout(ctx, s.growWait)
	granted, err := edgeWrite(wctx, s.rdb, s.region, agent, writes)
	cancel()
	if err = errors.Join(err, readErr); err != nil {
		if ctx.Err() == nil && !errors.Is(err, errEdgeSweeping) {
			s.down.failed(s.logger, sent, "error", err)
		}
		return granted, nil, err
	}
	s.down.ok(s.logger, sent)
	return granted, others, nil
}
