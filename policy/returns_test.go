package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// returnLimits are small limits of every algorithm, so that random
// sequences fill them, roll windows and refill buckets.
var returnLimits = []Limits{
	{Algorithm: TokenBucket, Capacity: 10 * Micro, Rate: 4 * Micro},
	{Algorithm: TokenBucket, Capacity: 7_333_333, Rate: 1_666_666},
	{Algorithm: FixedWindow, Capacity: 10 * Micro, WindowMs: 1000},
	{Algorithm: SlidingWindow, Capacity: 10 * Micro, WindowMs: 1000},
	{Algorithm: SlidingLog, Capacity: 10 * Micro, WindowMs: 1000},
}

// event is one decision of a sequence: a charge admitted (cost > 0), or
// one that charged nothing (a refused charge, a return), each under the
// limits in force then.
type event struct {
	at, cost int64
	l        Limits
	returned bool // a charge that a later return gave back
}

// replay is the state the limiter would be in at now had it made the
// decisions of hist but admitted none of the returned charges: what
// returns may at most free. Every other charge must still be admitted
// (fewer charges never leave less room).
func replay(t *testing.T, l Limits, hist []event, now int64) State {
	t.Helper()
	var s State
	for _, e := range hist {
		if e.cost == 0 || e.returned {
			s, _ = transition(s, e.l, e.at, 0)
			continue
		}
		var d Decision
		var err error
		if s, d, err = Apply(s, e.l, e.at, e.cost); err != nil || !d.Allowed {
			t.Fatalf("replay without the returned charges refused the charge at %d (%d): %v %v", e.at, e.cost, d, err)
		}
	}
	s, _ = transition(s, l, now, 0)
	return s
}

// remainingAt is what a charge at t would see left in s.
func remainingAt(s State, l Limits, t int64) int64 {
	_, d := transition(s, l, t, 0)
	return d.Remaining
}

// Returns never free more than the requests they return took: after any
// sequence of charges and returns, whichever charges the returns stand
// for (the oldest held, the newest, or any), the state leaves at most as
// much room, now and at every later moment, as a limiter that never
// admitted the returned requests; and exactly as much when requests
// return oldest first, but for the token bucket, which takes refill to
// have restored the oldest held first and so frees less of a held unit
// the longer ago it was taken. The ledger is exact throughout. The limits
// change now and then, as a region's share does.
func TestReturnNeverFreesMoreThanTaken(t *testing.T) {
	for _, order := range []string{"oldest", "newest", "random"} {
		for li, l := range returnLimits {
			for seed := range uint64(40) {
				t.Run(fmt.Sprintf("%s/%s-%d/%d", order, l.Algorithm, li, seed), func(t *testing.T) {
					checkReturns(t, l, order, rand.New(rand.NewPCG(seed, uint64(li))))
				})
			}
		}
	}
}

func checkReturns(t *testing.T, base Limits, order string, r *rand.Rand) {
	var s State
	var hist []event
	now := int64(1_000_000)
	l := base
	for step := range 120 {
		now += r.Int64N(l.IdleMs() / 3)
		switch r.IntN(10) { // the share changes
		case 0:
			l = base.Scale(int64(1+r.IntN(5)), 6)
		case 1:
			l = base
		}
		held := []int{}
		for i, e := range hist {
			if e.cost > 0 && !e.returned {
				held = append(held, i)
			}
		}
		if len(held) > 0 && r.IntN(5) < 2 {
			i := held[r.IntN(len(held))]
			switch order {
			case "oldest":
				i = held[0]
			case "newest":
				i = held[len(held)-1]
			}
			var d Decision
			var err error
			before := s.Held
			if s, d, err = Return(s, l, now, hist[i].cost); err != nil || !d.Allowed || d.Matched != hist[i].cost || s.Held != before-hist[i].cost {
				t.Fatalf("step %d: returning %d: %+v %v, held %d -> %d", step, hist[i].cost, d, err, before, s.Held)
			}
			hist[i].returned = true
			hist = append(hist, event{at: now, l: l})
		} else {
			cost := min((r.Int64N(3)+1)*Micro, l.Capacity/Micro*Micro)
			var d Decision
			var err error
			if s, d, err = ApplyHeld(s, l, now, cost); err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				cost = 0
			}
			hist = append(hist, event{at: now, cost: cost, l: l})
		}
		truth := replay(t, l, hist, now)
		for _, ahead := range []int64{0, 1, l.IdleMs() / 4, l.IdleMs() / 2, l.IdleMs() - 1, l.IdleMs()} {
			ours, want := remainingAt(s, l, now+ahead), remainingAt(truth, l, now+ahead)
			if ours > want {
				t.Fatalf("step %d, %d ms ahead: %d left after the returns, a limiter that never admitted the returned requests has %d", step, ahead, ours, want)
			}
			if order == "oldest" && l.Algorithm != TokenBucket && l == base && ours < want {
				t.Fatalf("step %d, %d ms ahead: oldest-first returns leave %d, want %d (exact)", step, ahead, ours, want)
			}
		}
		var sum int64
		for _, e := range hist {
			if !e.returned {
				sum += e.cost
			}
		}
		if s.Held != sum {
			t.Fatalf("step %d: held %d, the charges not returned sum to %d", step, s.Held, sum)
		}
	}
}

// A return matches at most what the identity holds: returning more frees
// only that much, a return to a state that does not exist writes nothing,
// and a return that matches nothing frees nothing. Bad input is refused
// with the state unchanged.
func TestReturnMatchesOnlyWhatIsHeld(t *testing.T) {
	for _, l := range returnLimits {
		t.Run(string(l.Algorithm), func(t *testing.T) {
			ns, d, err := Return(State{}, l, 5000, Micro)
			if err != nil || ns.Exists || !d.Allowed || d.Matched != 0 || d.Freed != 0 || d.Remaining != l.Capacity {
				t.Fatalf("return to no state: %+v %+v %v, want nothing written, nothing matched", ns, d, err)
			}
			s, _, _ := ApplyHeld(State{}, l, 5000, 2*Micro)
			s, d, _ = Return(s, l, 5000, 5*Micro)
			if d.Matched != 2*Micro || d.Freed != 2*Micro || s.Held != 0 || d.Remaining != l.Capacity {
				t.Fatalf("returning 5 of 2 held: %+v, held %d; want 2 matched and freed, all back", d, s.Held)
			}
			s2, d, _ := Return(s, l, 5000, Micro)
			if d.Matched != 0 || d.Freed != 0 || d.Remaining != l.Capacity || s2.Held != 0 {
				t.Fatalf("returning with nothing held: %+v, want nothing matched", d)
			}
			// A charge under a policy without returns is not held.
			plain, _, _ := Apply(State{}, l, 5000, 3*Micro)
			if _, d, _ = Return(plain, l, 5000, 3*Micro); d.Matched != 0 || d.Remaining != l.Capacity-3*Micro {
				t.Fatalf("returning an unrecorded charge: %+v, want nothing matched, 7 left", d)
			}
			for _, bad := range []int64{0, -1, MaxCapacity + 1} {
				if got, _, err := Return(s, l, 5000, bad); err == nil || !equalHeld(got, s) {
					t.Fatalf("return of %d: %v, state %+v; want an error and no change", bad, err, got)
				}
			}
		})
	}
}

func equalHeld(a, b State) bool {
	return a.Exists == b.Exists && a.LastMs == b.LastMs && a.Tokens == b.Tokens && a.Count == b.Count &&
		a.Prev == b.Prev && a.Sum == b.Sum && a.Held == b.Held && len(a.Log) == len(b.Log)
}

// A saturated ledger frees nothing a return of any size could not: every
// return is matched to units older than anything counted.
func TestReturnSaturatedLedger(t *testing.T) {
	l := Limits{Algorithm: FixedWindow, Capacity: MaxCapacity, WindowMs: 1000}
	s := State{Exists: true, LastMs: 1000, Window: 1, Count: MaxCapacity, Held: MaxHeld}
	if s2, _, _ := ApplyHeld(State{Exists: true, LastMs: 1000, Window: 1, Held: MaxHeld}, l, 1000, Micro); s2.Held != MaxHeld {
		t.Fatalf("held %d past saturation, want %d", s2.Held, MaxHeld)
	}
	if _, d, _ := Return(s, l, 1000, MaxCapacity); d.Freed != 0 || d.Matched != MaxCapacity {
		t.Fatalf("return against a saturated ledger: %+v, want all matched, nothing freed", d)
	}
}
