package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
)

// A coordinator cut off for 5 s (renewals failing every round) gives one
// warning, and one "recovered" line once it answers again: a few lines
// per outage, not one per attempt.
func TestCoordinatorOutageLogsPaced(t *testing.T) {
	testenv.SkipSlow(t, "holds a coordinator outage through a real Redis and a fault proxy, over 10 s")
	k := policyCoordinator(t, apiPolicy)
	px, err := faultproxy.Start(k.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	var logs testenv.SyncBuffer
	ra := startAgent(t, "us", startRedis(t).Addr, []string{px.Addr}, func(c *Config) {
		c.Logger = logTo(&logs, hclog.Info)
	})
	testenv.WaitFor(t, 5*time.Second, "a lease", func() bool { amt, _ := ra.a.leaser.Enforce("api", "", time.Now()); return amt > 0 })
	px.Cut()
	time.Sleep(5 * time.Second) // the outage: its length, not an event, is what the pacing of the logs is tested against
	failuresBefore := counterValue(t, ra.a, "quotalease_agent_lease_renew_failures_total")
	px.Restore()
	testenv.WaitFor(t, 10*time.Second, "recovered", func() bool { return strings.Contains(logs.String(), "lease renewals recovered") })
	out := logs.String()
	warnings := strings.Count(out, "lease renewals failing") + strings.Count(out, "lease renewals still failing")
	t.Logf("%v failed renewals, %d warnings:\n%s", failuresBefore, warnings, out)
	if failuresBefore < 3 {
		t.Fatalf("only %v renewals failed: the outage was not exercised", failuresBefore)
	}
	if warnings != 1 || strings.Count(out, "lease renewals recovered") != 1 {
		t.Fatalf("%d warnings and %d recoveries for one 5 s outage, want 1 and 1", warnings, strings.Count(out, "recovered"))
	}
}
