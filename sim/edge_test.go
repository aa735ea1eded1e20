package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// runEdge runs edge-shift, cut to dur when positive, with the edge rule
// broken that breakEdge names ("": none).
func runEdge(t *testing.T, dur time.Duration, breakEdge string) *Result {
	t.Helper()
	s, err := scenario.Load("scenarios/edge-shift.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if dur > 0 {
		s.Duration = policy.Duration(dur)
	}
	e := newEngine(s)
	e.breakEdge = breakEdge
	res, err := e.run(nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// The edge in edge-shift, counted from every admission of every Envoy
// instance and agent: in every window the identity with the most admitted
// stays within the leased bound (its edge term included), and under the
// identity's limit outright (a static-share policy, reserved: neither the
// assignments, the fallback during eu's agent outage nor us's lapsed
// lease let any tenant above it); the instances decided most requests; a
// demand moved between instances is followed within a report interval
// plus an assignment's life (the old one is counted until it may have
// expired).
func TestEdgeShiftWithinBound(t *testing.T) {
	res := runEdge(t, 0, "")
	m, x := res.Mode("leased"), res.Edge
	if x == nil || x.Requests < 100_000 || x.DirectRequests < 20_000 || x.IdealAdmitted == 0 {
		t.Fatalf("edge result %+v: the edge or the direct path saw too little", x)
	}
	if !m.WithinBound || m.MaxOvershoot != 0 || m.MaxWindow > m.Limit {
		t.Errorf("leased: max window %v (%s at %d ms), limit %v, bound %v: want no overshoot", m.MaxWindow, m.MaxWindowIdentity, m.MaxWindowAtMs, m.Limit, m.Bound)
	}
	if x.EdgeTerm <= 0 || m.BoundTerms["edge"] != x.EdgeTerm {
		t.Errorf("edge term %v, bound terms %v", x.EdgeTerm, m.BoundTerms)
	}
	if want := 6*60/10 - 1; len(x.Windows) < want {
		t.Fatalf("%d windows, want at least %d", len(x.Windows), want)
	}
	for _, w := range x.Windows {
		if !w.Within || w.Total > w.Bound || w.Edge+w.Direct != w.Total {
			t.Errorf("window %+v beyond its bound", w)
		}
	}
	if m.DecisionModes["edge"] != x.Requests || m.DecisionModes["agent-down"] == 0 || m.DecisionModes["degraded"] == 0 {
		t.Errorf("decision modes %v: the edge, eu's agent outage and us's lapsed lease must all show", m.DecisionModes)
	}
	if x.ReportsDropped == 0 || x.Abandons == 0 {
		t.Errorf("%d reports dropped, %d abandons: the outage and the moves must show", x.ReportsDropped, x.Abandons)
	}
	cfg := edge.DefaultConfig()
	follow := scenario.EnvoyReportInterval + edge.Lifetime(5*time.Second, 1e-4, cfg.Margin) + 2*cfg.Tick
	moves := 0
	for _, f := range x.Follow {
		if f.Kind != "instances" {
			continue
		}
		moves++
		if f.Assigned90Ms < 0 || time.Duration(f.Assigned90Ms)*time.Millisecond > follow {
			t.Errorf("%+v: 90%% of the capacity assigned where the demand went after %d ms, want within %s", f, f.Assigned90Ms, follow)
		}
	}
	if moves < 3 || x.MaxAssigned90Ms < 0 {
		t.Errorf("%d moves between instances followed, worst %d ms", moves, x.MaxAssigned90Ms)
	}
}

// The edge's rules matter, and the test above would notice each broken:
// Envoy instances that never apply an assignment keep their no-assignment
// behaviour (deny) and the edge admits next to nothing; direct checks that
// take the region's whole capacity, not leaving the edge its reservation,
// let the tenants sending both ways above their limit.
func TestEdgeRulesMatter(t *testing.T) {
	const dur = 40 * time.Second
	ok := runEdge(t, dur, "")
	ignored := runEdge(t, dur, "assignments")
	if u, v := ok.Edge.Utilization, ignored.Edge.Utilization; u < 0.3 || v > 0.05 {
		t.Errorf("edge utilization %.3f, %.3f with assignments ignored: want well above 0.3, and near 0", u, v)
	}
	overlap := runEdge(t, dur, "reservations")
	if m := ok.Mode("leased"); m.MaxOvershoot != 0 {
		t.Errorf("leased overshoot %v with the reservation kept, want 0", m.MaxOvershoot)
	}
	if m := overlap.Mode("leased"); m.MaxOvershoot <= 0 || !strings.HasPrefix(m.MaxWindowIdentity, "tenant=mixed-") {
		t.Errorf("direct checks ignoring the edge's reservation: overshoot %v (%s), want the mixed tenants above their limit", m.MaxOvershoot, m.MaxWindowIdentity)
	}
}
