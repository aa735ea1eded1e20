package admission

import (
	"context"
	"testing"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// postHocPipeline is a pipeline over store with one global fixed window
// "tokens" (1000 a minute) that takes charges after the fact, leased in
// full.
func postHocPipeline(t testing.TB, store Store, clk *clock.Manual) *Pipeline {
	t.Helper()
	ps, err := policy.ParsePolicies([]byte("name: tokens\nidentity: [tenant]\nalgorithm: fixed_window\nlimit: 1000\nperiod: 1m\npost_hoc: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	var set PolicySet
	if err := set.Set(ps); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Policies, cfg.Store, cfg.Clock = &set, store, clk
	cfg.Shares = &fixedShares{amount: ps[0].Limits().Amount(), mode: lease.ModeLeased}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// applyingStore decides every ticket on one state with the pure
// transitions, at clk's time.
func applyingStore(state *policy.State, clk *clock.Manual) *fakeStore {
	return &fakeStore{decide: func(tk *Ticket) Decided {
		ns, d, err := policy.Apply(*state, tk.Limits, clk.Now().UnixMilli(), tk.Cost*policy.Micro)
		*state = ns
		return Decided{Decision: d, Err: err}
	}}
}

// applyingPostHoc is a postHocPipeline over an applyingStore, on a manual
// clock at 1,000 s: it returns the pipeline, its store and the state the
// store decides on, for the tests that look at what the store counted.
func applyingPostHoc(t testing.TB) (*Pipeline, *fakeStore, *policy.State) {
	t.Helper()
	clk := &clock.Manual{}
	clk.Set(1_000_000)
	state := &policy.State{}
	store := applyingStore(state, clk)
	return postHocPipeline(t, store, clk), store, state
}

// A check carries no cost and returns nothing; it reaches the store as a
// ticket of cost 0. A charge after the fact larger than the whole limit
// is valid, and every charge reaches the store (never the over-limit
// cache), while checks may be answered from it.
func TestChecksAndChargesAfterTheFact(t *testing.T) {
	p, store, state := applyingPostHoc(t)
	ctx := context.Background()
	for _, bad := range []Request{
		{Policy: "tokens", Attributes: tenant, Check: true, Cost: 5},
		{Policy: "tokens", Attributes: tenant, Check: true, Return: true},
	} {
		if _, err := p.Check(ctx, bad); !IsInputError(err) {
			t.Errorf("%+v: %v, want bad input", bad, err)
		}
	}
	if store.asked != 0 || state.Exists {
		t.Fatalf("bad input reached the store (%d) or changed state %+v", store.asked, state)
	}
	check := func() Outcome {
		t.Helper()
		o, err := p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Check: true})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	charge := func(n int64) Outcome {
		t.Helper()
		o, err := p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Cost: n})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := check(); !o.Allowed || state.Count != 0 {
		t.Fatalf("a check: %+v, count %d, want admitted and nothing counted", o, state.Count)
	}
	if o := charge(1500); o.Allowed || o.Via != ViaStore || state.Count != 1500*policy.Micro {
		t.Fatalf("a charge of 1500 against 1000: %+v, count %d, want refused by the store and counted", o, state.Count)
	}
	asked := store.asked
	if o := check(); o.Allowed || o.Debt != 500*policy.Micro {
		t.Fatalf("a check in debt: %+v, want refused with a debt of 500", o)
	}
	if o := check(); o.Allowed || o.Via != ViaOverLimit || store.asked != asked+1 {
		t.Fatalf("a second check: %+v (store asked %d more), want answered from the over-limit cache", o, store.asked-asked)
	}
	for range 3 {
		if o := charge(100); o.Allowed || o.Via != ViaStore {
			t.Fatalf("a charge while over: %+v, want refused by the store, which counts it", o)
		}
	}
	if state.Count != 1800*policy.Micro {
		t.Fatalf("count %d after the charges, want 1800 units: every one counted", state.Count)
	}
}

// The local fallback counts charges after the fact too: while the store
// is down a charge that no longer fits puts the fallback's budget into
// debt, and its checks are refused.
func TestFallbackCountsChargesAfterTheFact(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	store := &fakeStore{decide: func(*Ticket) Decided { return Decided{Err: errDown} }}
	p := postHocPipeline(t, store, &clk)
	ctx := context.Background()
	o, err := p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Cost: 5000})
	if err != nil || o.Via != ViaFallback || o.Allowed || o.Debt == 0 {
		t.Fatalf("a charge beyond the fallback's budget: %+v %v, want refused by the fallback, in debt", o, err)
	}
	o, err = p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Check: true})
	if err != nil || o.Allowed {
		t.Fatalf("a check after it: %+v %v, want refused", o, err)
	}
}

// A region without a share refuses checks without asking the store, but a
// charge after the fact is for a request already admitted: it reaches the
// store under the least limits, refused there and counted, so the region
// holds the debt on its own key.
func TestChargeWithoutShareIsCounted(t *testing.T) {
	p, store, state := applyingPostHoc(t)
	p.cfg.Shares = &fixedShares{mode: lease.ModeLeased} // nothing
	ctx := context.Background()
	o, err := p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Check: true})
	if err != nil || o.Allowed || store.asked != 0 {
		t.Fatalf("a check without a share: %+v %v (store asked %d), want refused without the store", o, err, store.asked)
	}
	o, err = p.Check(ctx, Request{Policy: "tokens", Attributes: tenant, Cost: 300})
	if err != nil || o.Allowed || o.Via != ViaStore || state.Count != 300*policy.Micro {
		t.Fatalf("a charge without a share: %+v %v, count %d, want refused by the store and counted", o, err, state.Count)
	}
}

// A refused check of a post-hoc policy shows its policy's max_cost as
// demand (its request's cost is unknown); everything else its cost.
func TestDemand(t *testing.T) {
	p := &policy.Policy{Cost: 1, PostHoc: true, MaxCost: 600}
	for _, c := range []struct {
		p       *policy.Policy
		cost    int64
		allowed bool
		want    int64
	}{
		{p, 0, false, 600},
		{p, 0, true, 0},
		{p, 250, false, 250},
		{&policy.Policy{Cost: 1, PostHoc: true}, 0, false, 1},
		{&policy.Policy{Cost: 1}, 0, false, 0},
	} {
		if got := Demand(c.p, c.cost, c.allowed); got != c.want*policy.Micro {
			t.Errorf("%+v cost %d allowed %v: %d, want %d units", *c.p, c.cost, c.allowed, got, c.want)
		}
	}
}
