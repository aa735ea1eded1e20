package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// A lowered limit is enforced within one renewal interval of the change,
// not at the next periodic reload: the coordinator puts a changed policy
// in force when SetPolicy returns and stamps every grant with the
// fingerprint of the policy it was computed from; the agent's next renewal
// brings a grant with the new fingerprint and the agent reloads its
// policies at once. The periodic reload is an hour here, so only the grant
// can tell.
//
// The slack on top of the interval covers the rest of that path: the
// lease loop's jitter (at most 1.5 RenewTick), the renewal and the
// ListPolicies round trips on loopback, and a loaded test machine. The
// reload is throttled to one a second after a reload, but none has
// happened since the agent's first load at start, so it is not waited for.
func TestChangedPolicyEnforcedWithinOneRenewal(t *testing.T) {
	prefix := testenv.Prefix(t)
	k := startCoordinator(t, prefix, "")
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	redisSrv := startRedis(t)
	ra := startAgent(t, "us", redisSrv.Addr, []string{k.addr}, func(c *Config) { c.PolicyRefresh = time.Hour })
	testenv.WaitFor(t, 5*time.Second, "a lease", func() bool { _, m := ra.a.leaser.Enforce("api", time.Now()); return m == lease.ModeLeased })
	renewal := ra.a.leaser.renewInterval()
	const slack = 300 * time.Millisecond

	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n")
	changed := time.Now() // in force at the coordinator from here
	testenv.WaitFor(t, 10*time.Second, "the lowered limit enforced", func() bool {
		o, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA})
		return err == nil && o.Policy.Limit == 10 && o.Limits.Capacity <= 10*policy.Micro
	})
	if took := time.Since(changed); took > renewal+slack {
		t.Fatalf("lowered limit enforced %v after the change, want within one renewal interval (%v) and %v", took.Round(time.Millisecond), renewal, slack)
	}
	t.Logf("lowered limit enforced %v after the change (renewal interval %v)", time.Since(changed).Round(time.Millisecond), renewal)
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
	testenv.WaitFor(t, 5*time.Second, "a lease", func() bool { _, m := ra.a.leaser.Enforce("api", time.Now()); return m == lease.ModeLeased })
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nfailure: {mode: fail-closed}\n")
	testenv.WaitFor(t, 10*time.Second, "the new failure mode loaded", func() bool {
		p, ok := ra.a.policies.Policy("api")
		return ok && p.Failure.Mode == policy.FailClosed
	})
	k.stop()
	testenv.WaitFor(t, 3*testTiming.ValidFor, "the lease to lapse", func() bool {
		_, m := ra.a.leaser.Enforce("api", time.Now())
		return m != lease.ModeLeased
	})
	if amt, m := ra.a.leaser.Enforce("api", time.Now()); amt != 0 {
		t.Fatalf("lapsed fail-closed lease enforces %d in mode %s, want 0", amt, m)
	}
	if o, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA}); err != nil || o.Allowed {
		t.Fatalf("check with a lapsed fail-closed lease: %+v %v, want rejected", o, err)
	}
}
