package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// A grant the coordinator refuses as stale (a new leader that never
// issued it, or one folded away) is never presented again: the next
// renewal asks anew and gets a lease.
func TestStaleGrantAskedAnew(t *testing.T) {
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	now := time.Unix(1_000_000, 0)
	coord := &staleCoordinator{}
	l := newLeaser(regional.NewRegion(rdb, "us"), "us-a", coord, testTiming, func() time.Time { return now }, hclog.NewNullLogger(), newMetrics(), nil)
	ps, err := policy.ParsePolicies([]byte(apiPolicy))
	if err != nil {
		t.Fatal(err)
	}
	l.setPolicies(ps)
	ctx := context.Background()
	if !l.renew(ctx, nil) { // 1.1, saved before the next renewal presents it
		t.Fatal("no first grant")
	}
	for i := 0; i < 20; i++ { // 1.1 is stale from now on
		now = now.Add(testTiming.ValidFor / 2)
		l.renew(ctx, nil)
	}
	coord.mu.Lock()
	defer coord.mu.Unlock()
	if coord.granted < 3 {
		t.Fatalf("after the grant went stale: %d grants in 20 renewals, presented %v", coord.granted, coord.presented)
	}
}

// staleCoordinator grants 1.1 once, then refuses 1.1 as stale and grants
// a fresh id to a request that presents none or another.
type staleCoordinator struct {
	mu        sync.Mutex
	seq       int
	granted   int
	presented []string
}

func (c *staleCoordinator) Lease(_ context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp := &pb.LeaseResponse{Epoch: 1}
	for _, q := range req.Quotas {
		c.presented = append(c.presented, q.GrantId)
		g := &pb.QuotaGrant{Quota: q.Quota}
		if q.GrantId == "1.1" {
			leaseapi.EncodeError(g, lease.ErrStaleGrant)
		} else {
			c.seq++
			c.granted++
			g.GrantId = fmt.Sprint("1.", c.seq) // 1.1 first, then never again
			g.Rate, g.Burst = 100*policy.Micro, 100*policy.Micro
			g.ValidForMs, g.RenewAfterMs = testTiming.ValidFor.Milliseconds(), testTiming.ValidFor.Milliseconds()/3
		}
		resp.Grants = append(resp.Grants, g)
	}
	return resp, nil
}
