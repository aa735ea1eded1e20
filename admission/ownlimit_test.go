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
// policy.UnderOwnLimit: its limit and window, fixed window, the region's
// lease fraction of it for a global policy, not in shadow mode. A batch with an own limit that cannot be enforced is refused
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
	// The own limit of a global policy is global too: a region whose lease
	// gives it half of the policy enforces half of the own limit.
	sh.amount = 5 * policy.Micro
	own := &policy.OwnLimit{Limit: 5, Period: policy.Duration(time.Minute)}
	o, err := p.Check(t.Context(), Request{Policy: "api", Attributes: tenant, Limit: own})
	if err != nil || !o.Allowed || o.Mode != lease.ModeLeased {
		t.Fatalf("own limit: %+v %v, want allowed under the lease", o, err)
	}
	tk := seen[0]
	if tk.Policy.Name != "api~1m0s" || tk.Policy.Algorithm != policy.FixedWindow || tk.Limits.Capacity != 5*policy.Micro/2 || tk.Limits.WindowMs != 60_000 {
		t.Fatalf("ticket %+v under %+v, want api~1m0s, half of 5 per minute on a fixed window", tk, tk.Policy)
	}
	// A share too small to hold one request of the own limit admits none.
	sh.amount = 1
	if o, err := p.Check(t.Context(), Request{Policy: "api", Attributes: tenant, Limit: own}); err != nil || o.Allowed || len(seen) != 1 {
		t.Fatalf("own limit under a tiny share: %+v %v (store asked %d times), want refused without the store", o, err, len(seen))
	}
	sh.amount = 10 * policy.Micro // the whole limit again, for the batches below

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
