package regional

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// returnsHarness is a harness whose policies, one per algorithm, accept
// returns.
func returnsHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	h.freshReturns()
	return h
}

// freshReturns gives h a new engine whose policies accept returns (see
// harness.fresh).
func (h *harness) freshReturns() {
	var ps []*policy.Policy
	for _, p := range testPolicies(h.t) {
		q := *p
		q.Returns = true
		ps = append(ps, &q)
	}
	h.eng = newEngine(h.t, h.rdb, ps, Config{Clock: &h.now})
}

// give returns cost units at nowMs under l.
func (h *harness) give(nowMs int64, l policy.Limits, tenant string, cost int64, idem string) policy.Decision {
	h.t.Helper()
	h.now.Set(nowMs)
	d, err := h.eng.Check(context.Background(), Request{Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": tenant},
		Cost: cost, Limits: &l, Return: true, IdempotencyKey: idem})
	if err != nil {
		h.t.Fatalf("return at %d: %v", nowMs, err)
	}
	return d
}

// heldState is state with the ledger read too.
func (h *harness) heldState(alg policy.Algorithm, tenant string) policy.State {
	h.t.Helper()
	s := h.state(alg, tenant)
	k := h.key(alg, tenant)
	if alg == policy.SlidingLog {
		k += ":m"
	}
	if u := h.rdb.HGet(context.Background(), k, "u").Val(); u != "" {
		s.Held, _ = strconv.ParseInt(u, 10, 64)
	}
	if r := h.rdb.HGet(context.Background(), k, "r").Val(); r != "" {
		s.Refused, _ = strconv.ParseInt(r, 10, 64)
	}
	if a := h.rdb.HGet(context.Background(), k, "a").Val(); a != "" && alg == policy.TokenBucket {
		s.Unrefilled, _ = strconv.ParseInt(a, 10, 64)
	}
	return s
}

// sameHeld compares states, the sliding log's by its cost per moment: a
// return takes from the oldest moment's entries, in whichever order each
// side keeps entries of one moment.
func sameHeld(a, b policy.State) bool {
	perMs := func(l []policy.LogEntry) []string {
		m := map[int64]int64{}
		for _, e := range l {
			m[e.AtMs] += e.Cost
		}
		var out []string
		for at, c := range m {
			out = append(out, fmt.Sprintf("%d/%d", at, c))
		}
		sort.Strings(out)
		return out
	}
	la, lb := perMs(a.Log), perMs(b.Log)
	a.Log, b.Log = nil, nil
	return equalState(a, b) && a.Held == b.Held && a.Refused == b.Refused && a.Unrefilled == b.Unrefilled && fmt.Sprint(la) == fmt.Sprint(lb)
}

// TestDifferentialReturns demands that the script and the Go twin
// (policy.ApplyHeld, policy.Return) agree on every charge and return of
// TestDifferential's seeded random sequences, a third of their steps made
// returns (of up to twice the limit: more than is held, too), and on the
// state and the ledger after each: windows rolling, buckets refilling, the
// clock stepping back and far forward, and the share changing.
func TestDifferentialReturns(t *testing.T) {
	h := returnsHarness(t)
	r := rand.New(rand.NewPCG(3, 4))
	for i, c := range randomCases(40, false) {
		l := c.lim
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			h.freshReturns()
			tenant := fmt.Sprintf("ret-%d", i)
			var s policy.State
			for step, st := range c.steps {
				lim := l
				if r.IntN(6) == 0 { // another share
					lim = l.Scale(int64(1+r.IntN(5)), 4)
					lim.Capacity, lim.Rate = max(policy.Micro, lim.Capacity), max(1, lim.Rate)
				}
				units := min(st.cost, max(1, lim.Capacity/policy.Micro))
				var want, got policy.Decision
				var err error
				if r.IntN(3) == 0 {
					units = r.Int64N(2*max(1, l.Capacity/policy.Micro)) + 1
					s, want, err = policy.Return(s, lim, st.now, units*policy.Micro)
					got = h.give(st.now, lim, tenant, units, "")
				} else {
					s, want, err = policy.ApplyHeld(s, lim, st.now, units*policy.Micro)
					got = h.check(st.now, lim, tenant, units)
				}
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("step %d at %d (%d units): script %+v, Go %+v", step, st.now, units, got, want)
				}
				if rs := h.heldState(l.Algorithm, tenant); !sameHeld(rs, s) {
					t.Fatalf("step %d: Redis state %+v, Go %+v", step, rs, s)
				}
			}
		})
	}
}

// A return to an identity with no state writes nothing; a keyed return
// retried is answered as first decided and frees nothing again, apart
// from a charge under the same key; a charge and a return of one call are
// decided in order.
func TestReturnsIdempotentAndWriteNothingUnheld(t *testing.T) {
	h := returnsHarness(t)
	fw := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 60_000}
	if d := h.give(1_000, fw, "nobody", 3, ""); !d.Allowed || d.Matched != 0 || d.Remaining != fw.Capacity || h.dbsize() != 0 {
		t.Fatalf("return to no state: %+v, %d keys; want nothing matched, nothing written", d, h.dbsize())
	}
	h.now.Set(1_000)
	d, err := h.eng.Check(context.Background(), Request{Policy: "fw", Attributes: map[string]string{"tenant": "a"}, Cost: 4, Limits: &fw, IdempotencyKey: "req-1"})
	if err != nil || !d.Allowed || d.Remaining != 6*policy.Micro {
		t.Fatalf("keyed charge: %+v %v", d, err)
	}
	first := h.give(1_001, fw, "a", 4, "req-1")
	if first.Replayed || first.Matched != 4*policy.Micro || first.Freed != 4*policy.Micro || first.Remaining != fw.Capacity {
		t.Fatalf("keyed return under the charge's key: %+v, want 4 matched and freed (not the charge's replay)", first)
	}
	h.check(1_002, fw, "a", 4) // another request takes 4
	again := h.give(1_003, fw, "a", 4, "req-1")
	if !again.Replayed || again.Remaining != fw.Capacity {
		t.Fatalf("retried return: %+v, want the first answer replayed", again)
	}
	if s := h.heldState(policy.FixedWindow, "a"); s.Count != 4*policy.Micro || s.Held != 4*policy.Micro {
		t.Fatalf("after the retried return: %+v, want the other request's 4 still counted and held", s)
	}
	res := h.eng.CheckBatch(context.Background(), []Request{
		{Policy: "fw", Attributes: map[string]string{"tenant": "b"}, Cost: 10, Limits: &fw},
		{Policy: "fw", Attributes: map[string]string{"tenant": "b"}, Cost: 3, Limits: &fw, Return: true},
		{Policy: "fw", Attributes: map[string]string{"tenant": "b"}, Cost: 3, Limits: &fw},
		{Policy: "fw", Attributes: map[string]string{"tenant": "b"}, Cost: 1, Limits: &fw},
	})
	if !res[0].Decision.Allowed || res[1].Decision.Freed != 3*policy.Micro || !res[2].Decision.Allowed || res[3].Decision.Allowed {
		t.Fatalf("batch take 10, return 3, take 3, take 1: %+v, want the 3 returned taken again and no more", res)
	}
}

// Charges of a policy that accepts no returns are not recorded: a return
// (which admission refuses for such a policy) could match nothing.
func TestChargesOfPlainPolicyNotHeld(t *testing.T) {
	h := newHarness(t)
	fw := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 60_000}
	h.check(1_000, fw, "a", 2)
	if u := h.rdb.HGet(context.Background(), h.key(policy.FixedWindow, "a"), "u").Val(); u != "" {
		t.Fatalf("ledger %q for a policy without returns, want none", u)
	}
	if _, err := h.eng.Check(context.Background(), Request{Policy: "fw", Attributes: map[string]string{"tenant": "a"}, Cost: 2, Return: true}); err == nil {
		t.Fatal("a return to a policy without returns was decided")
	}
}
