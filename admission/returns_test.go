package admission

import (
	"context"
	"errors"
	"testing"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// modelStore decides tickets on the pure transitions, as Redis would: a
// policy that accepts returns keeps its ledger (policy.ApplyHeld), a
// return is policy.Return. failing makes it fail every ticket.
type modelStore struct {
	states  map[string]policy.State
	now     *clock.Manual
	asked   int
	failing bool
}

func (s *modelStore) Decide(_ context.Context, ts []*Ticket) []Decided {
	out := make([]Decided, len(ts))
	for i, t := range ts {
		s.asked++
		if s.failing {
			out[i].Err = errDown
			continue
		}
		k, now, cost := t.tableKey(), s.now.Now().UnixMilli(), t.Cost*policy.Micro
		var ns policy.State
		switch {
		case t.Return:
			ns, out[i].Decision, out[i].Err = policy.Return(s.states[k], t.Limits, now, cost)
		case t.Policy.Returns:
			ns, out[i].Decision, out[i].Err = policy.ApplyHeld(s.states[k], t.Limits, now, cost)
		default:
			ns, out[i].Decision, out[i].Err = policy.Apply(s.states[k], t.Limits, now, cost)
		}
		s.states[k] = ns
	}
	return out
}

// returnsPipeline is a pipeline over a model store with "api" (no
// returns) and "conc" (a fixed window of 3 that accepts returns), both
// leased in full.
func returnsPipeline(t *testing.T, mod func(*Config)) (*Pipeline, *modelStore, *fixedShares, *recorder) {
	t.Helper()
	var clk clock.Manual
	clk.Set(1_000_000)
	ps, err := policy.ParsePolicies([]byte("name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n---\n" +
		"name: conc\nidentity: [tenant]\nalgorithm: fixed_window\nlimit: 3\nperiod: 1h\nreturns: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	var set PolicySet
	if err := set.Set(ps); err != nil {
		t.Fatal(err)
	}
	store := &modelStore{states: map[string]policy.State{}, now: &clk}
	sh := &fixedShares{amount: 1 << 62, mode: lease.ModeLeased}
	rec := &recorder{}
	cfg := DefaultConfig()
	cfg.Policies, cfg.Store, cfg.Shares, cfg.Clock, cfg.Observer = &set, store, sh, &clk, rec
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, store, sh, rec
}

// recorder counts the returns the observer is told of.
type recorder struct{ returns, replays, fellBack int }

func (r *recorder) Observe(t Ticket, _ Outcome) {
	if t.Return {
		r.returns++
	}
}
func (r *recorder) Replayed(Ticket)              { r.replays++ }
func (r *recorder) FellBack(Ticket, error, bool) { r.fellBack++ }

var conc = func(ret bool) Request { return Request{Policy: "conc", Attributes: tenant, Return: ret} }

// A batch holding a return to a policy that accepts none, or a return
// with its own limit, is refused whole with ErrReturnRefused (an input
// error), before anything of it is decided or charged; a return naming no
// policy is refused alone, as any such request.
func TestReturnRefusedWhole(t *testing.T) {
	p, store, _, _ := returnsPipeline(t, nil)
	for _, bad := range []Request{
		{Policy: "api", Attributes: tenant, Return: true},
		{Policy: "conc", Attributes: tenant, Return: true, Limit: &policy.OwnLimit{Limit: 5, Period: policy.Duration(60e9)}},
	} {
		res := p.CheckBatch(context.Background(), []Request{conc(false), bad, conc(false)})
		for i, r := range res {
			if !errors.Is(r.Err, ErrReturnRefused) || !IsInputError(r.Err) {
				t.Fatalf("%+v, request %d: %v, want the batch refused", bad, i, r.Err)
			}
		}
		if _, err := Resolve(mustPolicy(t, p, bad.Policy), bad, mustPolicy(t, p, bad.Policy).Limits()); !errors.Is(err, ErrReturnRefused) {
			t.Fatalf("Resolve %+v: %v", bad, err)
		}
	}
	if store.asked != 0 {
		t.Fatalf("the store was asked %d times for refused batches", store.asked)
	}
	res := p.CheckBatch(context.Background(), []Request{conc(false), {Policy: "nope", Attributes: tenant, Return: true}})
	if res[0].Err != nil || !res[0].Allowed || !errors.Is(res[1].Err, ErrUnknownPolicy) {
		t.Fatalf("a return to an unknown policy: %+v", res)
	}
}

func mustPolicy(t *testing.T, p *Pipeline, name string) *policy.Policy {
	pol, ok := p.cfg.Policies.Policy(name)
	if !ok {
		t.Fatalf("no policy %q", name)
	}
	return pol
}

// A return frees what it took: three holders fill the limit of 3, a
// fourth is refused (and returns, freeing nothing), one holder returns and
// a fifth is admitted. A rejection of a policy that accepts returns is
// never cached in-process (a return through any instance may lift it), so
// the admission after the return reaches the store.
func TestReturnFreesAndBypassesOverLimitCache(t *testing.T) {
	p, store, _, rec := returnsPipeline(t, nil)
	ctx := context.Background()
	for i := range 3 {
		if o, err := p.Check(ctx, conc(false)); err != nil || !o.Allowed {
			t.Fatalf("holder %d: %+v %v", i, o, err)
		}
	}
	if o, _ := p.Check(ctx, conc(false)); o.Allowed {
		t.Fatal("a fourth holder admitted over a limit of 3")
	}
	for i, want := range []int64{0, policy.Micro} { // the refused one's return, a holder's
		o, err := p.Check(ctx, conc(true))
		if err != nil || !o.Allowed || o.Matched != policy.Micro || o.Freed != want || o.Via != ViaStore {
			t.Fatalf("return %d: %+v %v, want 1 matched, %d freed", i, o, err, want)
		}
	}
	asked := store.asked
	if o, _ := p.Check(ctx, conc(false)); !o.Allowed || o.Via != ViaStore || store.asked != asked+1 {
		t.Fatalf("after the return: %+v (store asked %d -> %d), want admitted by the store", o, asked, store.asked)
	}
	if rec.returns != 2 {
		t.Fatalf("observer told of %d returns, want 2", rec.returns)
	}
}

// A keyed return retried is answered from the replay cache and frees
// nothing again; its key does not collide with the charge's under the
// same idempotency key.
func TestReturnReplayedOnce(t *testing.T) {
	p, _, _, rec := returnsPipeline(t, nil)
	ctx := context.Background()
	keyed := func(ret bool) Request { r := conc(ret); r.IdempotencyKey = "req-7"; return r }
	if o, _ := p.Check(ctx, keyed(false)); !o.Allowed {
		t.Fatal("keyed charge refused")
	}
	p.Check(ctx, conc(false)) // another holder
	first, _ := p.Check(ctx, keyed(true))
	if first.Via != ViaStore || first.Freed != policy.Micro {
		t.Fatalf("keyed return: %+v, want decided by the store, 1 freed", first)
	}
	again, _ := p.Check(ctx, keyed(true))
	if again.Via != ViaReplay || rec.replays != 1 {
		t.Fatalf("retried return: %+v, want replayed", again)
	}
	// Still held: the other holder's 1. Two more fit, not three.
	for i, want := range []bool{true, true, false} {
		if o, _ := p.Check(ctx, conc(false)); o.Allowed != want {
			t.Fatalf("holder %d after the retried return: %+v, want allowed %v", i, o, want)
		}
	}
}

// A return the store cannot decide, or one with no share, is dropped:
// answered allowed with nothing matched, never decided by the in-process
// fallback (which holds none of what Redis admitted) and never retried
// into a second return.
func TestReturnDroppedWithoutStoreOrShare(t *testing.T) {
	p, store, sh, rec := returnsPipeline(t, nil)
	ctx := context.Background()
	p.Check(ctx, conc(false))
	store.failing = true
	o, err := p.Check(ctx, conc(true))
	if err != nil || !o.Allowed || o.Matched != 0 || o.Via != ViaFallback || rec.fellBack != 1 {
		t.Fatalf("return with the store down: %+v %v", o, err)
	}
	store.failing = false
	sh.amount = 0
	if o, _ := p.Check(ctx, conc(true)); !o.Allowed || o.Matched != 0 || o.Via != ViaNoShare {
		t.Fatalf("return with no share: %+v", o)
	}
	sh.amount = 1 << 62
	if s := store.states["conc\x00tenant=a"]; s.Held != policy.Micro || s.Count != policy.Micro {
		t.Fatalf("after the dropped returns: %+v, want the holder's 1 still held", s)
	}
}
