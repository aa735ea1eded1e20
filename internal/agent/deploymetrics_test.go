package agent

import (
	"testing"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv/promnames"
)

// Every agent metric the alert rules and the Grafana dashboard query is
// one a running agent exports: a renamed metric fails here, not on an
// empty dashboard during an incident. Per-policy counters exist at zero as
// soon as the policy is loaded.
func TestDeployedQueriesUseExportedMetrics(t *testing.T) {
	ra := regionAgent(t, apiPolicy, nil)
	if _, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA}); err != nil {
		t.Fatal(err)
	}
	ra.a.leaser.updateMetrics(ra.a.cfg.Clock.Now())
	mfs, err := ra.a.m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	queried, err := promnames.Queried("../../deploy", "quotalease_agent_")
	if err != nil {
		t.Fatal(err)
	}
	if len(queried) < 8 {
		t.Fatalf("only %d agent metrics queried: %v", len(queried), queried)
	}
	for _, m := range queried {
		if !exported[m] {
			t.Errorf("the deploy artifacts query %s, which the agent does not export", m)
		}
	}
	for _, m := range []string{"quotalease_agent_degraded_seconds_total", "quotalease_agent_budget_admissions_total", "quotalease_agent_overlimit_cache_hits_total", "quotalease_agent_lease_renew_failures_total"} {
		if !exported[m] {
			t.Errorf("%s is not there at zero", m)
		}
	}
}
