package agent

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// An agent whose checks opened the breaker during a Redis outage becomes
// ready again by itself once Redis answers, with no check arriving after
// the outage: its load balancer stopped sending checks when it went
// unready, so none would ever come to close the breaker. Redis is paused
// (CLIENT PAUSE, connections kept), then stalled and restarted empty; each
// time /readyz says why the agent is unready while it is.
func TestReadyAgainWithoutTraffic(t *testing.T) {
	testenv.SkipSlow(t, "pauses and restarts a real redis-server and waits for readiness")
	k := policyCoordinator(t, "name: api\nidentity: [tenant]\nlimit: 1000\nperiod: 1s\n")
	srv := redistest.Start(t)
	var told atomic.Pointer[string] // the last readiness OnReadiness was told: "ready" or why not
	ra := startAgent(t, "us", srv.Addr, []string{k.addr}, func(c *Config) {
		c.CheckTimeout, c.BreakerCooldown = 50*time.Millisecond, 200*time.Millisecond
		c.OnReadiness = func(ok bool, why string) { told.Store(&why) }
	})
	toldReady := func() bool { w := told.Load(); return w != nil && *w == "ready" }
	admin := srv.Client(t)
	// openBreaker sends checks while Redis cannot answer, until the breaker
	// opens (bounded: the threshold is 3), and then no more.
	openBreaker := func(phase string) {
		t.Helper()
		for i := 0; i < 20 && !ra.a.admit.BreakerOpen(); i++ {
			if _, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA}); err != nil {
				t.Fatalf("%s: check %d: %v", phase, i, err)
			}
		}
		if !ra.a.admit.BreakerOpen() {
			t.Fatalf("%s: 20 checks against a stalled Redis did not open the breaker", phase)
		}
		if ok, why := ra.a.Readiness(); ok || !strings.Contains(why, "Redis") {
			t.Fatalf("%s: readiness %v %q with the breaker open: want unready, naming Redis", phase, ok, why)
		}
	}
	wantReady := func(phase string) {
		t.Helper()
		testenv.WaitFor(t, 15*time.Second, phase+": ready again with no check after the outage", ra.a.Ready)
		if ra.a.admit.BreakerOpen() {
			t.Fatalf("%s: ready with the breaker open", phase)
		}
		// What follows readiness (the gRPC health status) ends up told so
		// too, however short the outage it may not have seen was.
		testenv.WaitFor(t, 15*time.Second, phase+": OnReadiness told ready", toldReady)
	}

	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	openBreaker("paused")
	wantReady("after CLIENT PAUSE")

	if err := srv.Pause(); err != nil { // stalled: checks time out
		t.Fatal(err)
	}
	openBreaker("stalled")
	if err := srv.Restart(); err != nil { // and replaced by an empty Redis
		t.Fatal(err)
	}
	wantReady("after a restart")
}

// A wrong Redis password is named as such, with what to do, in the log and
// in /readyz, instead of "Redis unreachable" and a claim that Redis holds
// no saved policy set, which it was never asked.
func TestWrongRedisPasswordNamed(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "right")
	var logs testenv.SyncBuffer
	a := startBare(t, srv.Addr, func(c *Config) {
		c.Redis, c.Coordinator, c.KeepPolicies = failFastRedis(t, srv.Addr, "wrong"), &hungCoordinator{}, true
		c.Policies = func(context.Context) ([]*policy.Policy, error) { return nil, io.ErrUnexpectedEOF } // the coordinator is down too
		c.Logger = logTo(&logs, hclog.Info)
	})
	testenv.WaitFor(t, 10*time.Second, "the start's warnings", func() bool { return strings.Contains(logs.String(), "no policies yet") })
	ok, why := a.Readiness()
	out := logs.String()
	t.Logf("readiness: %v %q\nlog:\n%s", ok, why, out)
	if ok || !strings.Contains(why, "NOAUTH/WRONGPASS") || !strings.Contains(why, "--redis-password-file") {
		t.Errorf("readiness %v %q: want unready, naming Redis auth and the flag", ok, why)
	}
	if !strings.Contains(out, "NOAUTH/WRONGPASS") || strings.Contains(out, "holds no saved set") {
		t.Errorf("the log does not name Redis auth, or claims Redis holds no saved set:\n%s", out)
	}
}
