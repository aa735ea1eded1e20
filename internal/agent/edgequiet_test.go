package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
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
	for i := range 5 {
		o, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "a"}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !o.Allowed || o.Via != admission.ViaStore {
			t.Fatalf("check %d after a quiet spell: allowed %v, via %v; want allowed by Redis", i, o.Allowed, o.Via)
		}
	}
	if syncs() == s0 {
		t.Fatal("the checks were decided without a read of the region's reservations")
	}
}
