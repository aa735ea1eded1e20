package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
	"github.com/quota-lease/quota-lease/lease"
)

// An agent serving many identities at the edge plans, round after round,
// only those that need it: with leases of the default length (10 s, so a
// 4 s assignment is well inside every grant), 40 tenants on one Envoy
// instance reporting every 5 s (Envoy's interval), and the policies
// reloaded every 200 ms (unchanged), a round plans well under half of the
// identities (an identity about once a second: its reports, refreshes,
// reservation rewrites and renewals that change its share). The agent
// once planned every identity every round: all of them, 4 to 10 times a
// second. A round slowed down by load plans more of them each, but not
// more often: the test fails only if both are high.
func TestEdgePlansOnlyWhatMoves(t *testing.T) {
	testenv.SkipSlow(t, "watches an agent's rounds for over 10 s")
	k := startCoordinator(t, testenv.Prefix(t), "", func(c *coordinator.Config) { c.Timing = lease.DefaultTiming })
	setPolicy(t, k.addr, "name: api\nidentity: [tenant]\nlimit: 1000\nperiod: 1s\nburst: 1000\nedge: {instances: 4, no_assignment: deny}\n")
	ra := startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, func(c *Config) { c.Drift, c.Margin = lease.DefaultTiming.Drift, lease.DefaultTiming.Margin })
	in := startEnvoyEvery(t, ra.grpcAddr, "a", rlqsenvoy.EnvoyReportInterval)
	const tenants = 40
	stop := make(chan struct{})
	defer close(stop)
	var buckets []map[string]string
	for i := range tenants {
		b := map[string]string{"policy": "api", "tenant": fmt.Sprint("t", i)}
		buckets = append(buckets, b)
		go drive(in, b, 5, stop, time.Minute)
	}
	testenv.WaitFor(t, 30*time.Second, "every tenant assigned", func() bool {
		for _, b := range buckets {
			if assignedRate(in, b) == 0 {
				return false
			}
		}
		return true
	})
	r0, p0 := counterValue(t, ra.a, "quotalease_agent_edge_rounds_total"), counterValue(t, ra.a, "quotalease_agent_edge_identity_plans_total")
	start := time.Now()
	var r, p float64
	testenv.WaitFor(t, 30*time.Second, "40 more rounds", func() bool {
		r, p = counterValue(t, ra.a, "quotalease_agent_edge_rounds_total")-r0, counterValue(t, ra.a, "quotalease_agent_edge_identity_plans_total")-p0
		return r >= 40
	})
	share, often := p/(r*tenants), p/tenants/time.Since(start).Seconds()
	t.Logf("%.0f rounds planned %.0f identities: %.2f of the %d identities a round, each %.2f times a second", r, p, share, tenants, often)
	if share > 0.5 && often > 2.5 || p == 0 {
		t.Fatalf("rounds plan %.2f of the identities, each %.2f times a second (want under half, or under 2.5, and some)", share, often)
	}
	for _, b := range buckets {
		if assignedRate(in, b) == 0 {
			t.Fatalf("tenant %s lost its assignment", b["tenant"])
		}
	}
}
