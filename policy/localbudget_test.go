package policy

import (
	"math/rand/v2"
	"testing"
)

// Holding leaves exactly the asked fraction for every algorithm.
func TestHoldingLeavesFraction(t *testing.T) {
	for _, l := range []Limits{
		{Algorithm: TokenBucket, Capacity: 10 * Micro, Rate: Micro},
		{Algorithm: FixedWindow, Capacity: 10 * Micro, WindowMs: 1000},
		{Algorithm: SlidingWindow, Capacity: 10 * Micro, WindowMs: 1000},
		{Algorithm: SlidingLog, Capacity: 10 * Micro, WindowMs: 1000},
	} {
		for _, c := range []struct {
			frac  float64
			admit int
		}{{0, 0}, {0.35, 3}, {1, 10}, {-1, 0}, {2, 10}} {
			s := Holding(l, 5_000, c.frac)
			n := 0
			for {
				ns, d, err := Apply(s, l, 5_000, Micro)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				s, n = ns, n+1
			}
			if n != c.admit {
				t.Errorf("%s holding %v: admitted %d at once, want %d", l.Algorithm, c.frac, n, c.admit)
			}
		}
	}
}

// However the calls to a LocalBudget are spread (bursts, long pauses that
// prune keys, flapping between it and a store), one key never admits more
// in a window than one limiter of its limits can: capacity + rate * w.
func TestLocalBudgetNeverMints(t *testing.T) {
	l := Limits{Algorithm: TokenBucket, Capacity: 5 * Micro, Rate: 2 * Micro} // 5 burst, 2/s
	rng := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 50; run++ {
		b := NewLocalBudget[int]()
		start := rng.Float64()
		now := int64(1_000_000)
		var admitted []int64
		for i := 0; i < 2000; i++ {
			switch rng.IntN(10) {
			case 0:
				now += rng.Int64N(5000) // idle: sometimes long enough to prune
				b.Prune(now)
			default:
				now += rng.Int64N(50)
			}
			d, err := b.Decide(7, l, start, now, Micro)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted = append(admitted, now)
			}
		}
		const w = 3000 // ms: at most 5 + 2*3 = 11
		lo := 0
		for hi := range admitted {
			for admitted[hi]-admitted[lo] >= w {
				lo++
			}
			if n := hi - lo + 1; n > 11 {
				t.Fatalf("run %d: %d admitted within %d ms, one limiter admits at most 11", run, n, w)
			}
		}
	}
}
