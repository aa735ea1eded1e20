package agent

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// A region's instance places are the policy's instances, whichever of its
// agents the Envoy instances connect to: with two agents and instances: 4,
// three instances on one agent and one on the other are all served (a
// split of the places between the agents refused the third), a fifth is
// refused wherever it connects, and a place that frees on one agent goes
// to the instance waiting on the other.
func TestRLQSPlacesAcrossAgents(t *testing.T) {
	k := policyCoordinator(t, edgeTestPolicy)
	redisAddr := startRedis(t).Addr
	a := startAgent(t, "us", redisAddr, []string{k.addr}, fastEdge)
	b := startAgent(t, "us", redisAddr, []string{k.addr}, func(c *Config) { fastEdge(c); c.Instance = "us-2" })
	testenv.WaitFor(t, 10*time.Second, "both agents counting two in the region", func() bool {
		return a.a.leaser.Instances() == 2 && b.a.leaser.Instances() == 2
	})
	tenant := map[string]string{"policy": "api", "tenant": "acme"}
	var onA []*rawStream
	for i := range 3 {
		s := openRaw(t, a.grpcAddr)
		s.send(t, "shop", use(tenant, 0, 1, 0))
		if got, _ := s.next(t, tenant); got.GetQuotaAssignmentAction() == nil {
			t.Fatalf("instance %d on the first agent: %v, want an assignment", i+1, got)
		}
		onA = append(onA, s)
	}
	fourth := openRaw(t, b.grpcAddr)
	fourth.send(t, "shop", use(tenant, 0, 1, 0))
	if got, _ := fourth.next(t, tenant); got.GetQuotaAssignmentAction() == nil {
		t.Fatalf("the fourth instance, on the second agent: %v, want an assignment", got)
	}

	fifth := openRaw(t, b.grpcAddr)
	fifth.send(t, "shop", use(tenant, 0, 1, 0))
	testenv.WaitFor(t, 5*time.Second, "the fifth instance refused", func() bool {
		return edgeRefused(t, b.a, "instances") >= 1
	})
	// Three more syncs of the second agent, each of which would push an
	// assignment the fifth instance had a place for.
	syncs := counterValue(t, b.a, "quotalease_agent_edge_syncs_total")
	testenv.WaitFor(t, 5*time.Second, "three more syncs", func() bool {
		return counterValue(t, b.a, "quotalease_agent_edge_syncs_total") >= syncs+3
	})
	select {
	case m := <-fifth.got:
		t.Fatalf("the fifth instance got %v, want nothing while the region's four places are held", m)
	default:
	}

	onA[0].closeSend(t)
	// The first agent writes the freed place with its next read; the
	// second asks again with its own.
	if got, _ := fifth.next(t, tenant); got.GetQuotaAssignmentAction() == nil {
		t.Fatalf("the fifth instance once a place freed on the other agent: %v, want an assignment", got)
	}
	if n := edgeRefused(t, a.a, "instances"); n != 0 {
		t.Errorf("the first agent refused %v instances, want none", n)
	}
}
