package admission

import (
	"errors"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// A request's own limit (Envoy's limit override) is decided under
// policy.UnderOwnLimit: its limit and window, fixed window, region scope
// (no share, though the policy is global and leased), not in shadow
// mode. A batch with an own limit that cannot be enforced is refused
// whole, before the store is asked; a limit of 0 refuses only its
// request, as more than the limit holds.
func TestPipelineOwnLimit(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	var seen []*Ticket
	store := &fakeStore{decide: func(t *Ticket) Decided {
		seen = append(seen, t)
		return Decided{Decision: policy.Decision{Allowed: true}}
	}}
	p, sh := pipeline(t, store, &clk, nil)
	sh.amount = 1 // a share far smaller than the override: region scope ignores it
	own := &policy.OwnLimit{Limit: 5, Period: policy.Duration(time.Minute)}
	o, err := p.Check(t.Context(), Request{Policy: "api", Attributes: tenant, Limit: own})
	if err != nil || !o.Allowed || o.Mode != lease.ModeRegion {
		t.Fatalf("own limit: %+v %v, want allowed in region mode", o, err)
	}
	sh.amount = 10 * policy.Micro // the whole limit again, for the batches below
	tk := seen[0]
	if tk.Policy.Name != "api~1m0s" || tk.Policy.Algorithm != policy.FixedWindow || tk.Limits.Capacity != 5*policy.Micro ||
		tk.Limits.WindowMs != 60_000 || tk.Policy.Scope != policy.ScopeRegion {
		t.Fatalf("ticket %+v under %+v, want api~1m0s, 5 per minute on a fixed window, region scope", tk, tk.Policy)
	}

	bad := &policy.OwnLimit{Limit: 5, Period: policy.Duration(7 * 24 * time.Hour)}
	res := p.CheckBatch(t.Context(), []Request{{Policy: "api", Attributes: tenant}, {Policy: "api", Attributes: tenant, Limit: bad}})
	for i, r := range res {
		if !errors.Is(r.Err, policy.ErrInvalidOwnLimit) || !IsInputError(r.Err) {
			t.Fatalf("request %d of a batch with a week-long own limit: %v, want refused (ErrInvalidOwnLimit)", i, r.Err)
		}
	}
	if store.asked != 1 {
		t.Fatalf("store asked %d times, want once (the refused batch charges nothing)", store.asked)
	}

	res = p.CheckBatch(t.Context(), []Request{{Policy: "api", Attributes: tenant}, {Policy: "api", Attributes: tenant, Limit: &policy.OwnLimit{Period: policy.Duration(time.Second)}}})
	if res[0].Err != nil || !errors.Is(res[1].Err, policy.ErrCostExceedsCapacity) || store.asked != 2 {
		t.Fatalf("own limit 0: %+v (store asked %d), want only that request refused as over its capacity", res, store.asked)
	}
}
