package policy

import (
	"errors"
	"strings"
	"testing"
)

// A token budget whose cost is known after the response: checks (cost 0)
// admitted while the identity is within its limit, charges that no longer
// fit counted all the same, checks refused until the debt is repaid, in
// every algorithm.
func TestPostHocChargesAreCounted(t *testing.T) {
	const m = Micro
	for _, l := range []Limits{
		{Algorithm: TokenBucket, Capacity: 1000 * m, Rate: 10 * m, PostHoc: true},
		{Algorithm: FixedWindow, Capacity: 1000 * m, WindowMs: 60_000, PostHoc: true},
		{Algorithm: SlidingWindow, Capacity: 1000 * m, WindowMs: 60_000, PostHoc: true},
		{Algorithm: SlidingLog, Capacity: 1000 * m, WindowMs: 60_000, PostHoc: true},
	} {
		t.Run(string(l.Algorithm), func(t *testing.T) {
			now := int64(60_000 * 1000)
			var s State
			step := func(cost int64, allowed bool, debt int64) Decision {
				t.Helper()
				ns, d, err := Apply(s, l, now, cost*m)
				if err != nil {
					t.Fatalf("cost %d: %v", cost, err)
				}
				if d.Allowed != allowed || d.Debt != debt*m {
					t.Fatalf("cost %d: %+v, want allowed %v with a debt of %d", cost, d, allowed, debt)
				}
				s = ns
				return d
			}
			step(0, true, 0)      // a check charges nothing
			step(800, true, 0)    // the response's tokens
			step(800, false, 600) // no longer fits: refused, counted
			d := step(0, false, 600)
			if d.RetryAfterMs <= 0 {
				t.Fatalf("a check refused in debt: %+v, want a retry delay", d)
			}
			step(1500, false, 2100) // more than the whole limit: counted too
			now += d.RetryAfterMs   // the debt at the first check is repaid by then, not the rest
			if l.Algorithm == TokenBucket {
				_, d, _ = Apply(s, l, now, 0)
				if d.Allowed {
					t.Fatalf("a check before the whole debt is repaid: %+v, want refused", d)
				}
			}
			_, d, _ = Apply(s, l, now, 0)
			now += d.RetryAfterMs
			if _, d, _ = Apply(s, l, now, 0); !d.Allowed || d.Debt != 0 {
				t.Fatalf("a check once the retry delay has passed: %+v, want admitted", d)
			}
		})
	}
}

// Without PostHoc a cost above the capacity is refused as invalid and a
// refused charge counts nothing; a check is valid under any limits.
func TestChecksAndCostsWithoutPostHoc(t *testing.T) {
	l := Limits{Algorithm: FixedWindow, Capacity: 10 * Micro, WindowMs: 1000}
	if _, _, err := Apply(State{}, l, 5, 11*Micro); !errors.Is(err, ErrCostExceedsCapacity) {
		t.Fatalf("cost above the capacity: %v, want ErrCostExceedsCapacity", err)
	}
	if _, _, err := Apply(State{}, l, 5, -1); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("negative cost: %v, want ErrInvalidCost", err)
	}
	l.PostHoc = true
	if _, _, err := Apply(State{}, l, 5, MaxCapacity+1); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost above MaxCapacity: %v, want ErrInvalidCost", err)
	}
	s, d, err := Apply(State{}, l, 5, 0)
	if err != nil || !d.Allowed || s.Count != 0 {
		t.Fatalf("a check of an empty window: %+v %+v %v, want admitted, nothing counted", s, d, err)
	}
}

// A debt saturates at MaxDebt, and a sliding log over its limit keeps at
// most MaxLogEntries entries, never counting less than was charged.
func TestPostHocStaysBounded(t *testing.T) {
	tb := Limits{Algorithm: TokenBucket, Capacity: MaxCapacity, Rate: MaxRate, PostHoc: true}
	s := State{}
	for range 5 {
		s, _, _ = Apply(s, tb, 0, MaxCapacity)
	}
	if s.Tokens != -MaxDebt {
		t.Fatalf("tokens %d after charges far beyond the capacity, want -MaxDebt", s.Tokens)
	}
	sl := Limits{Algorithm: SlidingLog, Capacity: 10 * Micro, WindowMs: 60_000, PostHoc: true}
	s = State{}
	total := int64(0)
	for i := range int64(MaxLogEntries + 50) {
		var err error
		s, _, err = Apply(s, sl, 1000+i, Micro)
		if err != nil {
			t.Fatal(err)
		}
		total += Micro
	}
	if len(s.Log) > int(MaxLogEntries) || s.Sum != total {
		t.Fatalf("log of %d entries summing %d, want at most %d summing %d", len(s.Log), s.Sum, MaxLogEntries, total)
	}
	if last := s.Log[len(s.Log)-1]; last.AtMs != 1000+MaxLogEntries+49 || last.Cost != 51*Micro {
		t.Fatalf("newest entry %+v, want the merged charges at the last time", last)
	}
}

// post_hoc in a policy file and in an envoyproxy/ratelimit configuration,
// where it is the default.
func TestParsePostHoc(t *testing.T) {
	ps, err := ParsePolicies([]byte("name: llm\nidentity: [user]\nalgorithm: fixed_window\nlimit: 1000\nperiod: 1m\npost_hoc: true\nmax_cost: 4000\nmax_in_flight: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := ps[0]; !p.PostHoc || !p.Limits().PostHoc || p.MaxCost != 4000 || p.MaxInFlight != 5 {
		t.Fatalf("parsed %+v", p)
	}
	for _, bad := range []struct{ yaml, field string }{
		{"post_hoc: true\nreturns: true\n", `"post_hoc"`},
		{"max_cost: 10\n", `"max_cost"`},
		{"post_hoc: true\nmax_in_flight: -1\n", `"max_in_flight"`},
	} {
		_, err := ParsePolicies([]byte("name: x\nidentity: [user]\nlimit: 10\nperiod: 1s\n" + bad.yaml))
		if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("%q: %v, want an invalid %s", bad.yaml, err, bad.field)
		}
	}
	envoy := "domain: ai\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n  - key: conc\n    returns: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	for _, c := range []struct {
		extra string
		want  bool
	}{{"", true}, {"post_hoc: false\n", false}, {"post_hoc: true\nmax_cost: 8000\nmax_in_flight: 20\n", true}} {
		ps, err := ParseEnvoyConfig([]byte(c.extra + envoy))
		if err != nil {
			t.Fatal(err)
		}
		if ps[0].PostHoc != c.want || ps[1].PostHoc {
			t.Errorf("%q: post_hoc %v (returns: %v), want %v (returns: false)", c.extra, ps[0].PostHoc, ps[1].PostHoc, c.want)
		}
		if c.want && c.extra != "" && (ps[0].MaxCost != 8000 || ps[0].MaxInFlight != 20) {
			t.Errorf("%q: max_cost %d max_in_flight %d", c.extra, ps[0].MaxCost, ps[0].MaxInFlight)
		}
	}
}

// FuzzPostHoc checks charges after the fact on any schedule of checks and
// charges up to twice the capacity: every charge is counted (nothing is
// lost: what was charged since the start, less what the limit gave back
// since, is what the key counts), a check is admitted exactly when the key
// is within its limit, and a debt mints nothing.
func FuzzPostHoc(f *testing.F) {
	f.Add(int64(20*Micro), int64(5*Micro), false, []byte{2, 0, 100, 3, 1, 44, 0, 0, 200, 1, 0, 3})
	f.Add(int64(10*Micro), int64(1000), true, []byte{5, 0, 1, 4, 0, 1, 5, 0, 1, 0, 1, 0, 5, 0, 1})
	f.Fuzz(func(t *testing.T, capacity, param int64, window bool, script []byte) {
		l := Limits{Algorithm: TokenBucket, Capacity: capacity, Rate: param, PostHoc: true}
		if window {
			l = Limits{Algorithm: FixedWindow, Capacity: capacity, WindowMs: param, PostHoc: true}
		}
		if l.Validate() != nil {
			return
		}
		nows, costs := schedule(script, 2*max(1, capacity/Micro)+1)
		var s State
		for i, now := range nows {
			cost := (costs[i] - 1) * Micro // 0 (a check) to twice the capacity
			ns, d, err := Apply(s, l, now, cost)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			_, chk, _ := Apply(s, l, now, 0) // the key at this time, before the charge
			if cost == 0 && d != chk {
				t.Fatalf("step %d: a check decided %+v and %+v", i, d, chk)
			}
			switch l.Algorithm {
			case TokenBucket:
				if !chk.Allowed && chk.Debt == 0 {
					t.Fatalf("step %d: a check refused with no debt: %+v", i, chk)
				}
				want := -chk.Debt + chk.Remaining - cost
				if ns.Tokens != max(want, -MaxDebt) {
					t.Fatalf("step %d: tokens %d after charging %d to %d, want every charge counted", i, ns.Tokens, cost, want+cost)
				}
				if ns.Tokens > capacity {
					t.Fatalf("step %d: tokens %d above the capacity %d: minted", i, ns.Tokens, capacity)
				}
			case FixedWindow:
				if chk.Allowed != (chk.Debt == 0) {
					t.Fatalf("step %d: check %+v: admitted unless in debt", i, chk)
				}
				if prev := l.Capacity - chk.Remaining + chk.Debt; ns.Count != min(prev+cost, l.Capacity+MaxDebt) {
					t.Fatalf("step %d: count %d after charging %d to %d, want every charge counted", i, ns.Count, cost, prev)
				}
			}
			s = ns
		}
	})
}
