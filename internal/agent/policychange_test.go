package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// A lowered limit is enforced from the first renewal after the change,
// not at the next periodic reload: the grant carries the fingerprint of
// the policy it was computed from, and an agent holding another reloads.
// The periodic reload is an hour here, so only the grant can tell.
func TestChangedPolicyEnforcedWithinOneRenewal(t *testing.T) {
	prefix := testenv.Prefix(t)
	k := startCoordinator(t, prefix, "")
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	redisSrv := startRedis(t)
	ra := startAgent(t, "us", redisSrv.Addr, []string{k.addr}, func(c *Config) { c.PolicyRefresh = time.Hour })
	testenv.WaitFor(t, 5*time.Second, "a lease", func() bool { _, m := ra.a.leaser.enforce("api", time.Now()); return m == lease.ModeLeased })

	changed := time.Now()
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n")
	renewal := testTiming.RenewAfter()
	testenv.WaitFor(t, 3*renewal+5*time.Second, "the lowered limit enforced", func() bool {
		o, err := ra.a.Check(t.Context(), Input{Policy: "api", Attributes: tenantA})
		return err == nil && o.Policy.Limit == 10 && o.Limits.Capacity <= 10*policy.Micro
	})
	t.Logf("lowered limit enforced %v after the change (renewal interval %v, reload at most once a second)", time.Since(changed).Round(time.Millisecond), renewal)
}

// A failure mode changed from static-share to fail-closed is applied by
// the agent: with the coordinator gone, the lapsed lease admits nothing.
// The lease used to keep the failure mode it was created with.
func TestChangedFailureModeApplied(t *testing.T) {
	prefix := testenv.Prefix(t)
	k := startCoordinator(t, prefix, "")
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nfailure: {mode: static-share, static_fraction: 0.3}\n")
	redisSrv := startRedis(t)
	ra := startAgent(t, "us", redisSrv.Addr, []string{k.addr}, nil)
	testenv.WaitFor(t, 5*time.Second, "a lease", func() bool { _, m := ra.a.leaser.enforce("api", time.Now()); return m == lease.ModeLeased })
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nfailure: {mode: fail-closed}\n")
	testenv.WaitFor(t, 10*time.Second, "the new failure mode loaded", func() bool {
		p, ok := ra.a.engine.Policy("api")
		return ok && p.Failure.Mode == policy.FailClosed
	})
	k.stop()
	testenv.WaitFor(t, 3*testTiming.ValidFor, "the lease to lapse", func() bool {
		_, m := ra.a.leaser.enforce("api", time.Now())
		return m != lease.ModeLeased
	})
	if amt, m := ra.a.leaser.enforce("api", time.Now()); amt != 0 {
		t.Fatalf("lapsed fail-closed lease enforces %d in mode %s, want 0", amt, m)
	}
	if o, err := ra.a.Check(t.Context(), Input{Policy: "api", Attributes: tenantA}); err != nil || o.Allowed {
		t.Fatalf("check with a lapsed fail-closed lease: %+v %v, want rejected", o, err)
	}
}
