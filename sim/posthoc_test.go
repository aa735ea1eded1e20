package sim

import (
	"testing"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// llm-tokens: conversations under a token budget charged after the fact.
// Every mode stays within its published bound in every window, the post-hoc
// term included; the modes with one counter on true time (the ideal limiter
// and the central counter) charge one identity at most the limit plus the
// post-hoc term in any of the policy's windows, and more than the limit in
// some (charges are counted over it); leasing keeps most of the ideal's
// tokens, far more than a static split.
func TestLLMTokens(t *testing.T) {
	s, err := scenario.Load("scenarios/llm-tokens.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Parsed()
	// One counter window ends over its limit by at most what was in flight.
	perPeriod := p.Limit + float64(p.MaxInFlight)*float64(p.MaxCost)
	for _, m := range res.Modes {
		c := m.Conversations
		if c == nil || c.Charges == 0 || c.Tokens < c.Charges*100 {
			t.Fatalf("%s: conversations %+v", m.Mode, c)
		}
		if m.BoundTerms[bound.TermPostHoc] == 0 || !m.WithinBound {
			t.Errorf("%s: most tokens in a window %v, bound %v (terms %v)", m.Mode, m.MaxWindow, m.Bound, m.BoundTerms)
		}
		for _, ep := range m.Epochs {
			if ep.MaxWindow > ep.Bound {
				t.Errorf("%s: epoch at %d ms: %v tokens in a window, bound %v", m.Mode, ep.StartMs, ep.MaxWindow, ep.Bound)
			}
		}
	}
	for _, name := range []string{Ideal, "central"} {
		c := res.Mode(name).Conversations
		if c.MaxPeriod > perPeriod || c.MaxPeriod <= p.Limit {
			t.Errorf("%s: most charged in one period %v (%s), want above the limit %v and at most %v", name, c.MaxPeriod, c.MaxPeriodIdentity, p.Limit, perPeriod)
		}
	}
	leased, static := res.Mode("leased"), res.Mode("static")
	if c := leased.Conversations; c.UncountedTokens != 0 {
		t.Errorf("leased: %d tokens charged where no share counted them", c.UncountedTokens)
	}
	t.Logf("leased utilization %.1f%% of the ideal's tokens (static %.1f%%), most in a window %v of %v",
		100*leased.Utilization, 100*static.Utilization, leased.MaxWindow, leased.Bound)
	// A refused check counts max_cost as demand (admission.Demand): without
	// it a user whose budget ran out shows none, and its region's share
	// drifts away (91% of the ideal).
	if leased.Utilization < 0.95 || leased.Utilization < static.Utilization+0.3 {
		t.Errorf("leased utilization %.3f, static %.3f, want at least 0.95 and far above static", leased.Utilization, static.Utilization)
	}
}

// A gateway that keeps max_in_flight: no mode ever has more conversations
// of one identity checked and not yet charged.
func TestConversationsKeepMaxInFlight(t *testing.T) {
	s, err := scenario.Load("scenarios/llm-tokens.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s.Groups[0].Rate = 5 // far more than 4 at a time
	e := newEngine(s)
	res, err := e.run(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range res.Modes {
		if m.Conversations.InFlightRefused == 0 {
			t.Errorf("%s: the gateway never turned an arrival away", m.Mode)
		}
		for id, n := range e.conv.inFlight[i] {
			if n < 0 || n > s.Parsed().MaxInFlight {
				t.Errorf("%s: %s has %d in flight", m.Mode, e.ids.names[id], n)
			}
		}
		if !m.WithinBound {
			t.Errorf("%s: %v in a window, bound %v", m.Mode, m.MaxWindow, m.Bound)
		}
	}
}
