package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
	refused  bool // a charge that was refused
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
		if e.cost == 0 || e.refused || e.returned {
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
// for (the oldest outstanding, the newest, or any), the state leaves at
// most as much room, now and at every later moment, as a limiter that
// never admitted the returned requests; and exactly as much when requests
// return oldest first and none was refused, but for the token bucket,
// which takes refill to have restored the oldest held first and so frees
// less of a held unit the longer ago it was taken. Refused requests
// return too, as Envoy's do ("envoy"), or never. The ledger matches every
// return. The limits change now and then, as a region's share does.
func TestReturnNeverFreesMoreThanTaken(t *testing.T) {
	for _, order := range []string{"oldest", "newest", "random"} {
		for _, envoy := range []bool{true, false} {
			for li, l := range returnLimits {
				for seed := range uint64(30) {
					t.Run(fmt.Sprintf("%s/envoy=%v/%s-%d/%d", order, envoy, l.Algorithm, li, seed), func(t *testing.T) {
						checkReturns(t, l, order, envoy, rand.New(rand.NewPCG(seed, uint64(li))))
					})
				}
			}
		}
	}
}

func checkReturns(t *testing.T, base Limits, order string, envoy bool, r *rand.Rand) {
	var s State
	var hist []event
	now := int64(1_000_000)
	l := base
	everRefused := false
	for step := range 120 {
		now += r.Int64N(l.IdleMs() / 3)
		switch r.IntN(10) { // the share changes
		case 0:
			l = base.Scale(int64(1+r.IntN(5)), 6)
		case 1:
			l = base
		}
		var out []int // charges whose return is still to come
		for i, e := range hist {
			if e.cost > 0 && !e.returned && (envoy || !e.refused) {
				out = append(out, i)
			}
		}
		if len(out) > 0 && r.IntN(5) < 2 {
			i := out[r.IntN(len(out))]
			switch order {
			case "oldest":
				i = out[0]
			case "newest":
				i = out[len(out)-1]
			}
			var d Decision
			var err error
			before := s.Held + s.Refused
			if s, d, err = Return(s, l, now, hist[i].cost); err != nil || !d.Allowed || d.Matched != hist[i].cost || s.Held+s.Refused != before-hist[i].cost {
				t.Fatalf("step %d: returning %d: %+v %v, held and refused %d -> %d", step, hist[i].cost, d, err, before, s.Held+s.Refused)
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
			hist = append(hist, event{at: now, cost: cost, l: l, refused: !d.Allowed})
			everRefused = everRefused || !d.Allowed
		}
		truth := replay(t, l, hist, now)
		for _, ahead := range []int64{0, 1, l.IdleMs() / 4, l.IdleMs() / 2, l.IdleMs() - 1, l.IdleMs()} {
			ours, want := remainingAt(s, l, now+ahead), remainingAt(truth, l, now+ahead)
			if ours > want {
				t.Fatalf("step %d, %d ms ahead: %d left after the returns, a limiter that never admitted the returned requests has %d", step, ahead, ours, want)
			}
			if order == "oldest" && !everRefused && l.Algorithm != TokenBucket && l == base && ours < want {
				t.Fatalf("step %d, %d ms ahead: oldest-first returns leave %d, want %d (exact)", step, ahead, ours, want)
			}
		}
		var sum int64
		for _, e := range hist {
			if !e.returned {
				sum += e.cost
			}
		}
		if s.Held+s.Refused != sum {
			t.Fatalf("step %d: held %d and refused %d, the charges not returned sum to %d", step, s.Held, s.Refused, sum)
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

// FuzzReturns runs any schedule of charges and returns, of any size
// (bad ones included), on any limits: bad input is refused with the state
// unchanged; otherwise a return is allowed, matches at most what is held
// or refused and what it asked, frees at most what it matched, never
// leaves more than the capacity, and the ledger is what was charged less
// what was matched.
func FuzzReturns(f *testing.F) {
	f.Add(uint8(0), int64(10*Micro), int64(4*Micro), []byte{2, 0, 100, 3, 1, 44, 0, 0, 200, 1, 0, 3, 5, 9, 9})
	f.Add(uint8(1), int64(10*Micro), int64(700), []byte{2, 0, 100, 3, 1, 44, 7, 0, 200, 1, 0, 3})
	f.Add(uint8(3), int64(5*Micro), int64(300), []byte{7, 0, 9, 6, 0, 9, 7, 0, 9, 6, 255, 255})
	algs := []Algorithm{TokenBucket, FixedWindow, SlidingWindow, SlidingLog}
	f.Fuzz(func(t *testing.T, which uint8, capacity, param int64, script []byte) {
		l := Limits{Algorithm: algs[int(which)%len(algs)], Capacity: capacity, Rate: param, WindowMs: param}
		if l.Validate() != nil {
			if _, _, err := Return(State{Exists: true}, l, 0, Micro); err == nil {
				t.Fatalf("invalid limits %+v accepted", l)
			}
			return
		}
		nows, costs := schedule(script, max(1, capacity/Micro))
		var s State
		var charged, matched int64
		for i, now := range nows {
			units := costs[i] * Micro
			if script[3*i]%4 == 3 { // a return, of any size
				units = int64(script[3*i+1])<<40 - int64(script[3*i+2])<<8
				ns, d, err := Return(s, l, now, units)
				if err != nil {
					if !equalHeld(ns, s) || units >= 1 && units <= MaxCapacity {
						t.Fatalf("step %d: return of %d refused (%v) or state changed", i, units, err)
					}
					continue
				}
				if !d.Allowed || d.Matched > min(units, s.Held+s.Refused) || d.Freed > d.Matched || d.Freed < 0 || d.Remaining > l.Capacity ||
					ns.Held+ns.Refused != s.Held+s.Refused-d.Matched {
					t.Fatalf("step %d: returning %d with %d held: %+v, held after %d", i, units, s.Held, d, ns.Held)
				}
				matched += d.Matched
				s = ns
				continue
			}
			ns, _, err := ApplyHeld(s, l, now, units)
			if err != nil {
				continue // cost above capacity
			}
			charged += units // admitted, or refused and awaiting its return
			s = ns
		}
		if s.Held+s.Refused != charged-matched || s.Unrefilled < 0 || s.Unrefilled > l.Capacity {
			t.Fatalf("held %d and refused %d (unrefilled %d), charged %d less matched %d", s.Held, s.Refused, s.Unrefilled, charged, matched)
		}
	})
}

// returns: true is a policy's, or a descriptor's in an envoyproxy/ratelimit
// configuration; a policy with shards cannot take returns.
func TestReturnsField(t *testing.T) {
	ps, err := ParsePolicyFile([]byte("domain: r\ndescriptors:\n  - key: user\n    returns: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n" +
		"  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil || len(ps) != 2 || !ps[0].Returns || ps[1].Returns {
		t.Fatalf("envoy config: %v %v, want returns on the user limit only", ps, err)
	}
	if _, err := ParsePolicies([]byte("name: c\nidentity: [u]\nalgorithm: sliding_log\nlimit: 5\nperiod: 1h\nreturns: true\n")); err != nil {
		t.Fatal(err)
	}
	_, err = ParsePolicies([]byte("name: c\nidentity: [u]\nlimit: 50\nperiod: 1s\nshards: 2\nreturns: true\n"))
	if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "returns") {
		t.Fatalf("returns with shards: %v, want refused naming returns", err)
	}
}
