package agent

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// refusingCoordinator refuses the first renewal for the region's call rate
// (as the coordinator does: ResourceExhausted), then answers every one
// without grants: each quota refused.
type refusingCoordinator struct{ calls atomic.Int64 }

func (c *refusingCoordinator) Lease(context.Context, *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	if c.calls.Add(1) == 1 {
		return nil, status.Error(codes.ResourceExhausted, `region "us" sent more than 100 lease calls a second`)
	}
	return &pb.LeaseResponse{}, nil
}

// A renewal refused for the call rate is counted as rate-limited, not as
// the coordinator being unavailable; an answer refusing 20 quotas at once
// is one log line naming the count, not 20.
func TestRenewalRefusalsCountedAndAggregated(t *testing.T) {
	var docs []string
	for i := 0; i < 20; i++ {
		docs = append(docs, fmt.Sprintf("{name: p%02d, identity: [tenant], limit: 10, period: 1s}", i))
	}
	ps := testenv.MustPolicies(t, strings.Join(docs, "\n---\n"))
	var logs testenv.SyncBuffer
	coord := &refusingCoordinator{}
	a := startBare(t, startRedis(t).Addr, func(c *Config) {
		c.Coordinator = coord
		c.Policies = func(context.Context) ([]*policy.Policy, error) { return ps, nil }
		c.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &logs})
	})
	testenv.WaitFor(t, 10*time.Second, "a refused answer", func() bool { return strings.Contains(logs.String(), "leases refused") })
	rateLimited := counterValueLabeled(t, a, "quotalease_agent_lease_renew_failures_total", "reason", "rate-limited")
	unavailable := counterValueLabeled(t, a, "quotalease_agent_lease_renew_failures_total", "reason", "unavailable")
	if rateLimited != 1 || unavailable != 0 {
		t.Fatalf("rate-limited %v, unavailable %v: want 1 and 0", rateLimited, unavailable)
	}
	out := logs.String()
	if !strings.Contains(out, "leases refused: quotas=20") || strings.Contains(out, "lease refused:") {
		t.Fatalf("want one line for the 20 refused quotas:\n%s", out)
	}
}
