package agent

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/regional"
)

// A process killed and started again under its instance name (as a
// StatefulSet or systemd restarts it) takes the name back as soon as its
// predecessor's heartbeat has stopped, long before the predecessor's 20 s
// grants end (it used to wait them out, and its Envoys went dark as the
// restored grant neared its end). A second process started beside a live
// one still gets nothing under the name, and the live one keeps it.
func TestRestartTakesNameAtOnce(t *testing.T) {
	testenv.SkipSlow(t, "restarts agents against grants valid for 20 s")
	k := startCoordinator(t, testenv.Prefix(t), "", func(c *coordinator.Config) { c.Timing.ValidFor = 20 * time.Second })
	setPolicy(t, k.addr, edgeTestPolicy)
	addr := startRedis(t).Addr
	var killedRedis redis.UniversalClient
	first := startAgent(t, "us", addr, []string{k.addr}, func(c *Config) { killedRedis = c.Redis })
	testenv.WaitFor(t, 5*time.Second, "the first process recorded as the name's holder", func() bool {
		return killedRedis.HGet(t.Context(), regional.NewRegion(killedRedis, "us").Key("instances"), "us-1").Val() == first.a.leaser.nonce
	})

	// Killed: its Redis client goes first, so it leaves its heartbeat and
	// holder record behind as a dead process would.
	killedRedis.Close()
	first.stop()
	second := startAgent(t, "us", addr, []string{k.addr}, nil)
	// The first process renewed at most a third of a grant's life before,
	// so its last grant holds for at least 13 s more: a grant within 10 s
	// is the name handed over.
	testenv.WaitFor(t, 10*time.Second, "the restarted process's own grant", func() bool { return ownGrant(second.a) })

	// A duplicate beside a live process is refused, again and again (it
	// looks at the holder's heartbeat each time), and the live one keeps
	// renewing unrefused.
	refused := func(ra *runningAgent) float64 {
		return counterValueLabeled(t, ra.a, "quotalease_agent_lease_renew_failures_total", "reason", "refused")
	}
	before := refused(second) // its own refusals before it took the name
	dup := startAgent(t, "us", addr, []string{k.addr}, nil)
	testenv.WaitFor(t, 10*time.Second, "the duplicate refused three times", func() bool { return refused(dup) >= 3 })
	if ownGrant(dup.a) {
		t.Fatal("a second process took the name of a live one")
	}
	if n := refused(second) - before; n != 0 {
		t.Fatalf("the live process was refused %v times beside a duplicate", n)
	}
}

// ownGrant reports whether a holds a grant the coordinator answered it
// (not one restored from Redis) for every policy.
func ownGrant(a *Agent) bool {
	a.leaser.mu.Lock()
	defer a.leaser.mu.Unlock()
	for _, q := range a.leaser.quotas {
		if !q.a.Own() {
			return false
		}
	}
	return len(a.leaser.quotas) > 0
}
