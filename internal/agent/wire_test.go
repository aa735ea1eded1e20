package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// shuffledCoordinator grants every quota but "b", answering in reverse
// order: an answer is matched to its quotas by name, never by position.
type shuffledCoordinator struct{ calls atomic.Int64 }

func (s *shuffledCoordinator) Lease(_ context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	s.calls.Add(1)
	resp := &pb.LeaseResponse{Epoch: 1}
	for i := len(req.Quotas) - 1; i >= 0; i-- {
		q := req.Quotas[i]
		if q.Quota == "b" {
			continue
		}
		rate := map[string]int64{"a": 10, "c": 30}[q.Quota] * policy.Micro
		resp.Grants = append(resp.Grants, &pb.QuotaGrant{Quota: q.Quota, GrantId: q.Quota + "-1", Rate: rate, Burst: rate, ValidForMs: 2000})
	}
	return resp, nil
}

func TestGrantsMatchedByName(t *testing.T) {
	ps := testenv.MustPolicies(t, "{name: a, identity: [tenant], limit: 100, period: 1s}\n---\n{name: b, identity: [tenant], limit: 100, period: 1s}\n---\n{name: c, identity: [tenant], limit: 100, period: 1s}\n")
	coord := &shuffledCoordinator{}
	a := startBare(t, startRedis(t).Addr, func(c *Config) {
		c.Coordinator = coord
		c.Policies = func(context.Context) ([]*policy.Policy, error) { return ps, nil }
	})
	testenv.WaitFor(t, 10*time.Second, "a lease round", func() bool { return coord.calls.Load() > 0 && a.Ready() })
	for name, want := range map[string]struct {
		amount int64
		mode   lease.Mode
	}{"a": {10 * policy.Micro, lease.ModeLeased}, "b": {0, lease.ModeDegraded}, "c": {30 * policy.Micro, lease.ModeLeased}} {
		amt, mode := a.leaser.Enforce(name, "", time.Now())
		if amt != want.amount || mode != want.mode {
			t.Errorf("%s: %d in mode %s, want %d in %s", name, amt, mode, want.amount, want.mode)
		}
	}
}
