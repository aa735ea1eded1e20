package regional

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// step is one request in a differential case.
type step struct {
	now  int64
	cost int64 // whole units
	lim  *policy.Limits
}

// diffCase is a named sequence of requests run through both the pure
// transition and the Lua script on real Redis.
type diffCase struct {
	name  string
	lim   policy.Limits
	steps []step
}

// limitsAt returns the limits of step st, and false for a step whose cost
// they cannot hold (refused by validation, tested elsewhere).
func (c diffCase) limitsAt(st step) (policy.Limits, bool) {
	l := c.lim
	if st.lim != nil {
		l = *st.lim
	}
	return l, st.cost*policy.Micro <= l.Capacity || l.PostHoc
}

func handCases() []diffCase {
	tb := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}
	odd := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 7_333_333, Rate: 1_666_666} // 100/min, a third of 22
	fw := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 1000}
	sw := policy.Limits{Algorithm: policy.SlidingWindow, Capacity: 10 * policy.Micro, WindowMs: 1000}
	sl := policy.Limits{Algorithm: policy.SlidingLog, Capacity: 10 * policy.Micro, WindowMs: 1000}
	lowered := func(l policy.Limits) *policy.Limits { l.Capacity /= 2; return &l }
	var cases []diffCase
	for _, l := range []policy.Limits{tb, odd, fw, sw, sl} {
		cases = append(cases,
			diffCase{string(l.Algorithm) + "/drain-and-refill", l, []step{
				{now: 100_000, cost: 5}, {now: 100_000, cost: 5}, {now: 100_000, cost: 5}, {now: 100_001, cost: 5},
				{now: 100_250, cost: 3}, {now: 100_999, cost: 2}, {now: 101_000, cost: 7}, {now: 101_500, cost: 4},
			}},
			diffCase{string(l.Algorithm) + "/clock-backward", l, []step{
				{now: 50_000, cost: 7}, {now: 49_000, cost: 3}, {now: 49_500, cost: 3}, {now: 50_000, cost: 3},
				{now: 50_700, cost: 1}, {now: 10, cost: 1}, {now: 51_999, cost: 6},
			}},
			diffCase{string(l.Algorithm) + "/far-forward", l, []step{
				{now: 1_000, cost: 7}, {now: policy.MaxTimeMs, cost: 1}, {now: policy.MaxTimeMs, cost: 7},
			}},
			diffCase{string(l.Algorithm) + "/limits-lowered", l, []step{
				{now: 5_000, cost: 2}, {now: 5_100, cost: 1, lim: lowered(l)}, {now: 5_200, cost: 3, lim: lowered(l)},
				{now: 6_100, cost: 4}, {now: 7_000, cost: 1, lim: lowered(l)},
			}},
		)
	}
	// A sliding log of 100 entries: a rejection's retry reads the log
	// oldest first in pages of 16, 32, 64, and the large costs need
	// entries from the second and the last page.
	long := diffCase{name: "sliding_log/retry-deep-in-the-log", lim: policy.Limits{Algorithm: policy.SlidingLog, Capacity: 100 * policy.Micro, WindowMs: 10_000}}
	for i := range int64(100) {
		long.steps = append(long.steps, step{now: 1_000 + 10*i, cost: 1})
	}
	long.steps = append(long.steps, step{now: 2_500, cost: 30}, step{now: 2_600, cost: 60}, step{now: 2_700, cost: 100})
	return append(cases, long)
}

// randomCases are seeded random sequences, so a failure names a case that
// replays.
// randomCases are n cases of random limits and steps; with postHoc the
// limits count charges after the fact and the costs run from 0 (a check)
// to twice the capacity.
func randomCases(n int, postHoc bool) []diffCase {
	seed := uint64(2)
	if postHoc {
		seed = 3
	}
	r := rand.New(rand.NewPCG(1, seed))
	var cases []diffCase
	for i := 0; i < n; i++ {
		l := randomLimits(r, i)
		now := r.Int64N(1 << 40)
		l.PostHoc = postHoc
		c := diffCase{name: fmt.Sprintf("random-%d/%s", i, l.Algorithm), lim: l}
		if postHoc {
			c.name = fmt.Sprintf("post-hoc-%d/%s", i, l.Algorithm)
		}
		for j := 0; j < 40; j++ {
			switch r.IntN(10) {
			case 0:
				now -= r.Int64N(3000) // clock steps back
			case 1:
				now += r.Int64N(100_000)
			default:
				now += r.Int64N(700)
			}
			if now < 0 {
				now = 0
			}
			cost := r.Int64N(max(1, l.Capacity/policy.Micro)) + 1
			if postHoc {
				cost = r.Int64N(2*l.Capacity/policy.Micro + 1)
			}
			c.steps = append(c.steps, step{now: now, cost: cost})
		}
		cases = append(cases, c)
	}
	return cases
}

// randomLimits are random limits of the algorithm i picks in turn.
func randomLimits(r *rand.Rand, i int) policy.Limits {
	switch i % 4 {
	case 0:
		return policy.Limits{Algorithm: policy.TokenBucket, Capacity: r.Int64N(50*policy.Micro) + policy.Micro, Rate: r.Int64N(20*policy.Micro) + 1000}
	case 1:
		return policy.Limits{Algorithm: policy.FixedWindow, Capacity: r.Int64N(50*policy.Micro) + policy.Micro, WindowMs: r.Int64N(5000) + 1}
	case 2:
		return policy.Limits{Algorithm: policy.SlidingWindow, Capacity: r.Int64N(50*policy.Micro) + policy.Micro, WindowMs: r.Int64N(5000) + 1}
	default:
		return policy.Limits{Algorithm: policy.SlidingLog, Capacity: r.Int64N(30*policy.Micro) + policy.Micro, WindowMs: r.Int64N(5000) + 1}
	}
}

// paths returns the ways the cases of l's algorithm are decided: a fixed
// window both with its counters and with the script, the others with the
// script.
func (c diffCase) paths() []string {
	if c.lim.Algorithm == policy.FixedWindow {
		return []string{"counted", "scripted"}
	}
	return []string{"script"}
}

// TestDifferential demands that the pure Go transition and Redis (the
// script, and a fixed window's counters) agree on every decision and on
// the persisted state, step by step.
func TestDifferential(t *testing.T) {
	h := newHarness(t)
	for i, c := range append(append(handCases(), randomCases(80, false)...), randomCases(40, true)...) {
		for _, path := range c.paths() {
			t.Run(c.name+"/"+path, func(t *testing.T) {
				h.t = t
				h.fresh(path == "scripted")
				tenant := fmt.Sprintf("case-%d-%s", i, path)
				var s policy.State
				for j, st := range c.steps {
					l, ok := c.limitsAt(st)
					if !ok {
						continue // refused by validation, covered elsewhere
					}
					ns, want, err := policy.Apply(s, l, st.now, st.cost*policy.Micro)
					if err != nil {
						t.Fatalf("step %d: pure: %v", j, err)
					}
					got := h.check(st.now, l, tenant, st.cost)
					if got != want {
						t.Fatalf("step %d (t=%d cost=%d): redis %+v, pure %+v", j, st.now, st.cost, got, want)
					}
					if rs := h.state(l.Algorithm, tenant); !equalState(rs, ns) {
						t.Fatalf("step %d: redis state %+v, pure state %+v", j, rs, ns)
					}
					s = ns
				}
			})
		}
	}
}

// TestDifferentialLostStore runs the cases again in a store that lost its
// memory: the birth marker is gone (the first script records the loss) or
// says the store was born a little before the first step. The scripts must
// start missing keys exactly where Fresh says, and go on agreeing.
func TestDifferentialLostStore(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	for i, c := range append(append(handCases(), randomCases(40, false)...), randomCases(20, true)...) {
		for _, ago := range []int64{-1, 0, c.lim.IdleMs() / 2, c.lim.IdleMs()} {
			for _, path := range c.paths() {
				t.Run(fmt.Sprintf("%s/born-%dms-before/%s", c.name, ago, path), func(t *testing.T) {
					h.t = t
					h.fresh(path == "scripted")
					tenant := fmt.Sprintf("lost-%d-%d-%s", i, ago, path)
					first := c.steps[0].now
					born := first - ago
					if ago < 0 {
						born = first // the marker is missing: the first check records now
						h.rdb.Del(ctx, BornKey)
					} else {
						h.rdb.Set(ctx, BornKey, born, 0)
					}
					var s policy.State
					started := false
					for j, st := range c.steps {
						l, ok := c.limitsAt(st)
						if !ok {
							continue // refused by validation, covered elsewhere
						}
						if !started {
							s, started = policy.Fresh(l, st.now, born), true
						}
						ns, want, err := policy.Apply(s, l, st.now, st.cost*policy.Micro)
						if err != nil {
							t.Fatalf("step %d: pure: %v", j, err)
						}
						got := h.check(st.now, l, tenant, st.cost)
						if l.Algorithm == policy.FixedWindow && born > 0 && ns.Window == born/l.WindowMs && !l.PostHoc {
							// The window of the loss counts as used up at the
							// limits of each decision: a limit lowered since
							// the pure state's start is no debt there.
							want.Debt = got.Debt
						}
						if got != want {
							t.Fatalf("step %d (t=%d cost=%d, born %d): redis %+v, pure %+v", j, st.now, st.cost, born, got, want)
						}
						rs := h.state(l.Algorithm, tenant)
						if l.Algorithm == policy.FixedWindow && born > 0 && ns.Window == born/l.WindowMs {
							// The window of the loss counts as used up (the
							// marker says so), but its counter holds only what
							// was charged in it: nothing, or what was charged
							// after the fact beyond the used-up limit.
							charged := int64(0)
							if l.PostHoc {
								charged = ns.Count - c.lim.Capacity
							}
							if rs.Exists && (rs.Window != ns.Window || rs.Count != charged) || !rs.Exists && charged != 0 {
								t.Fatalf("step %d: redis state %+v, want no charge in the window of the loss (pure state %+v)", j, rs, ns)
							}
						} else if !equalState(rs, ns) {
							t.Fatalf("step %d: redis state %+v, pure state %+v", j, rs, ns)
						}
						s = ns
					}
					if v, _ := h.rdb.Get(ctx, BornKey).Int64(); v != born {
						t.Fatalf("marker %d after the case, want %d", v, born)
					}
				})
			}
		}
	}
}

// TestFreshMintsNoBurst: in a young store a missing key admits no more than
// a key that had used everything at the birth, and in an old one it starts
// full.
func TestFreshMintsNoBurst(t *testing.T) {
	for _, l := range []policy.Limits{
		{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: policy.Micro},
		{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 1000},
		{Algorithm: policy.SlidingWindow, Capacity: 10 * policy.Micro, WindowMs: 1000},
		{Algorithm: policy.SlidingLog, Capacity: 10 * policy.Micro, WindowMs: 1000},
	} {
		born := int64(50_000)
		if s := policy.Fresh(l, born+l.IdleMs(), born); s.Exists {
			t.Errorf("%s: a store born IdleMs ago starts keys at %+v, want the zero State", l.Algorithm, s)
		}
		if s := policy.Fresh(l, born, 0); s.Exists {
			t.Errorf("%s: a new store starts keys at %+v, want the zero State", l.Algorithm, s)
		}
		s := policy.Fresh(l, born+1, born)
		if _, d, _ := policy.Apply(s, l, born+1, policy.Micro); d.Allowed {
			t.Errorf("%s: a key lost 1 ms ago admitted at once", l.Algorithm)
		}
	}
}

// TestDifferentialBatched runs the cases again with every step sent as one
// batch of four decisions in one script call: the step twice on the case's
// key (the second must see the first's charge), and once on a second key
// under an idempotency key, retried in the same batch (the retry must be
// the same decision, replayed). All of them must agree with the pure
// transition applied one decision after the other.
func TestDifferentialBatched(t *testing.T) {
	h := newHarness(t)
	for i, c := range append(append(handCases(), randomCases(40, false)...), randomCases(20, true)...) {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			h.fresh(false)
			a, b := fmt.Sprintf("batch-%d-a", i), fmt.Sprintf("batch-%d-b", i)
			var sa, sb policy.State
			for j, st := range c.steps {
				l, ok := c.limitsAt(st)
				if !ok {
					continue // refused by validation, covered elsewhere
				}
				cost := st.cost * policy.Micro
				sa1, want1, err1 := policy.Apply(sa, l, st.now, cost)
				sa2, want2, err2 := policy.Apply(sa1, l, st.now, cost)
				sb1, wantB, err3 := policy.Apply(sb, l, st.now, cost)
				if err := errors.Join(err1, err2, err3); err != nil {
					t.Fatalf("step %d: pure: %v", j, err)
				}
				req := func(tenant, idem string) Request {
					return Request{Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": tenant}, Cost: st.cost, Check: st.cost == 0, Limits: &l, IdempotencyKey: idem}
				}
				idem := fmt.Sprint("step-", j)
				h.now.Set(st.now)
				res := h.eng.CheckBatch(t.Context(), []Request{req(a, ""), req(b, idem), req(a, ""), req(b, idem)})
				replayed := wantB
				replayed.Replayed = true
				for k, want := range []policy.Decision{want1, wantB, want2, replayed} {
					if res[k].Err != nil || res[k].Decision != want {
						t.Fatalf("step %d (t=%d cost=%d) decision %d: redis %+v %v, pure %+v", j, st.now, st.cost, k, res[k].Decision, res[k].Err, want)
					}
				}
				if rs := h.state(l.Algorithm, a); !equalState(rs, sa2) {
					t.Fatalf("step %d: redis state %+v, pure state %+v", j, rs, sa2)
				}
				if rs := h.state(l.Algorithm, b); !equalState(rs, sb1) {
					t.Fatalf("step %d: second key: redis state %+v, pure state %+v", j, rs, sb1)
				}
				sa, sb = sa2, sb1
			}
		})
	}
}
