package agent

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// An agent refused because another live process holds its instance name
// backs off for the delay the refusal carries instead of asking again at
// every tick (it used to ask ten times a second and log each refusal), logs
// the refusal when it starts and then at most every 30 s, counts it as
// refused, and says when it ends.
func TestInstanceHeldBacksOff(t *testing.T) {
	var logs strings.Builder
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	now := time.Unix(1_000_000, 0)
	coord := &heldCoordinator{heldFor: 5 * time.Second}
	m := newMetrics()
	l := newLeaser(regional.NewRegion(startRedis(t).Client(t), "us"), "us-a", coord, testTiming, func() time.Time { return now }, log, m, nil)
	ps, err := policy.ParsePolicies([]byte(apiPolicy))
	if err != nil {
		t.Fatal(err)
	}
	l.setPolicies(ps)
	ctx := context.Background()
	// Ten ticks a second for a minute, the name held all along.
	for range 600 {
		l.renew(ctx, nil)
		now = now.Add(100 * time.Millisecond)
	}
	if n := coord.calls.Load(); n < 11 || n > 13 {
		t.Fatalf("%d lease requests in a minute while held for 5 s at a time, want about 12", n)
	}
	if n := strings.Count(logs.String(), "\n"); n < 2 || n > 3 {
		t.Fatalf("%d log lines in a minute of refusals, want 2 or 3:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "held by another agent process") {
		t.Fatalf("the log does not say why:\n%s", logs.String())
	}
	if got := counterValueLabeled(t, &Agent{m: m}, "quotalease_agent_lease_renew_failures_total", "reason", "refused"); got != float64(coord.calls.Load()) {
		t.Fatalf("refusals counted %v, want %d", got, coord.calls.Load())
	}
	coord.heldFor = 0
	now = now.Add(5 * time.Second)
	if !l.renew(ctx, nil) {
		t.Fatal("no grant once the name was free")
	}
	if !strings.Contains(logs.String(), "recovered") {
		t.Fatalf("the end of the refusals is not logged:\n%s", logs.String())
	}
}

// heldCoordinator refuses every Lease call as naming a held instance for
// heldFor, or grants the whole limit when heldFor is 0.
type heldCoordinator struct {
	heldFor time.Duration
	calls   atomic.Int64
}

func (c *heldCoordinator) Lease(_ context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	c.calls.Add(1)
	if c.heldFor > 0 {
		return nil, leaseapi.InstanceHeldError(req.Region, req.Instance, c.heldFor)
	}
	resp := &pb.LeaseResponse{Epoch: 1}
	for _, q := range req.Quotas {
		resp.Grants = append(resp.Grants, &pb.QuotaGrant{Quota: q.Quota, GrantId: "1.1", Rate: 100 * policy.Micro, Burst: 100 * policy.Micro,
			ValidForMs: testTiming.ValidFor.Milliseconds(), RenewAfterMs: testTiming.ValidFor.Milliseconds() / 3})
	}
	return resp, nil
}
