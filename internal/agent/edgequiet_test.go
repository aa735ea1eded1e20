package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// An agent serving a policy at the edge, with no Envoy instance reporting
// and no direct check, reads nothing of the region's reservations: its
// rounds go quiet (edge/quiet.go). The first direct check after that asks
// for a read, waits for it and is decided by Redis, allowed as any check
// within the limit (not refused for want of a fresh read); while checks
// keep coming, the rounds read again.
func TestQuietEdgeReadsWhenAsked(t *testing.T) {
	ra := regionAgent(t, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nburst: 100\nedge: {instances: 4, no_assignment: deny}\n", nil)
	waitLeased(t, ra.a, "api", 10*time.Second)
	syncs := func() float64 { return counterValue(t, ra.a, "quotalease_agent_edge_syncs_total") }
	s0 := syncs()
	time.Sleep(2 * time.Second) // eight reads' time, were the rounds reading
	if n := syncs() - s0; n > 1 {
		t.Fatalf("an agent with nothing at the edge synced %.0f times in 2 s, want none (a round under way at most)", n)
	}
	allowedByRedis(t, ra.a, 5, "after a quiet spell")
	if syncs() == s0 {
		t.Fatal("the checks were decided without a read of the region's reservations")
	}
}

// A policy the edge starts serving while the agent served none there (its
// rounds resting) has its direct checks decided by Redis at once: the
// rounds wake to read the region's reservations, and a check that finds
// no read yet asks for one, instead of taking the edge to hold everything
// until the next round (10 s away while resting).
func TestEdgeServedLaterReadsAtOnce(t *testing.T) {
	k, ra := coordinatedAgent(t, "name: plain\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n", nil)
	waitLeased(t, ra.a, "plain", 10*time.Second)
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nburst: 100\nedge: {instances: 4, no_assignment: deny}\n")
	// The region's whole limit (a first grant is smaller, and grows).
	testenv.WaitFor(t, 10*time.Second, "the whole limit leased", func() bool {
		if _, m := ra.a.leaser.Enforce("api", "", time.Now()); m != lease.ModeLeased {
			return false
		}
		g, _ := heldGrant(ra.a, "api")
		return g.Amount == g.Total
	})
	allowedByRedis(t, ra.a, 5, "once the edge serves the policy")
}

// allowedByRedis checks n requests of tenant a of policy api on a, each of
// which must be allowed by Redis (when, says what came before).
func allowedByRedis(t *testing.T, a *Agent, n int, when string) {
	t.Helper()
	for i := range n {
		o, err := a.Check(t.Context(), admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "a"}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !o.Allowed || o.Via != admission.ViaStore {
			t.Fatalf("check %d %s: allowed %v, via %v; want allowed by Redis", i, when, o.Allowed, o.Via)
		}
	}
}
