package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A lowered limit is enforced within one renewal of the change, not at
// the next periodic reload: the coordinator puts a changed policy in
// force when SetPolicy returns and stamps every grant with the
// fingerprint of the policy it was computed from; the agent's first
// renewal after the change brings a grant with the new fingerprint and the
// agent reloads its policies at once. The periodic reload is an hour here,
// so only the grant can tell.
//
// The test counts renewals, not time: the renewals the agent sends after
// the change while it still enforces the old limit must be at most one
// (that first renewal). A renewal already in flight at the change may
// carry a grant of the old policy; it started before and does not count.
func TestChangedPolicyEnforcedWithinOneRenewal(t *testing.T) {
	var lc *renewalCounter
	k, ra := coordinatedAgent(t, apiPolicy, func(c *Config) {
		c.PolicyRefresh = time.Hour
		lc = &renewalCounter{LeaseClient: c.Coordinator}
		c.Coordinator = lc
	})
	lc.old = func() bool { p, ok := ra.a.policies.Policy("api"); return ok && p.Limit != 10 }
	waitLeased(t, ra.a, "api", 5*time.Second)

	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n")
	lc.changed.Store(true) // in force at the coordinator from here
	testenv.WaitFor(t, 10*time.Second, "the lowered limit enforced", func() bool {
		o, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA})
		return err == nil && o.Policy.Limit == 10 && o.Limits.Capacity <= 10*policy.Micro
	})
	if n := lc.stale.Load(); n > 1 {
		t.Fatalf("%d renewals sent after the change before the lowered limit was enforced, want at most 1", n)
	}
}

// renewalCounter counts the renewals sent once changed is set while old
// reports the old policy still loaded.
type renewalCounter struct {
	LeaseClient
	old     func() bool
	changed atomic.Bool
	stale   atomic.Int64
}

func (c *renewalCounter) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	if c.changed.Load() && c.old() {
		c.stale.Add(1)
	}
	return c.LeaseClient.Lease(ctx, req)
}

// A failure mode changed from static-share to fail-closed is applied by
// the agent: with the coordinator gone, the lapsed lease admits nothing.
// The lease used to keep the failure mode it was created with.
func TestChangedFailureModeApplied(t *testing.T) {
	k, ra := coordinatedAgent(t, apiPolicy+"failure: {mode: static-share, static_fraction: 0.3}\n", nil)
	waitLeased(t, ra.a, "api", 5*time.Second)
	setPolicy(t, k.addr, apiPolicy+"failure: {mode: fail-closed}\n")
	testenv.WaitFor(t, 10*time.Second, "the new failure mode loaded", func() bool {
		p, ok := ra.a.policies.Policy("api")
		return ok && p.Failure.Mode == policy.FailClosed
	})
	k.stop()
	testenv.WaitFor(t, 3*testTiming.ValidFor, "the lease to lapse", func() bool {
		_, m := ra.a.leaser.Enforce("api", "", time.Now())
		return m != lease.ModeLeased
	})
	if amt, m := ra.a.leaser.Enforce("api", "", time.Now()); amt != 0 {
		t.Fatalf("lapsed fail-closed lease enforces %d in mode %s, want 0", amt, m)
	}
	if o, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA}); err != nil || o.Allowed {
		t.Fatalf("check with a lapsed fail-closed lease: %+v %v, want rejected", o, err)
	}
}
