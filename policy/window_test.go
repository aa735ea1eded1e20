package policy

import "testing"

func TestFixedWindow(t *testing.T) {
	l := Limits{Algorithm: FixedWindow, Capacity: 10 * Micro, WindowMs: 1000}
	s, d, _ := Apply(State{}, l, 5_200, 10*Micro)
	if !d.Allowed || d.ResetAfterMs != 800 {
		t.Fatalf("first: %+v", d)
	}
	s, d, _ = Apply(s, l, 5_900, Micro)
	if d.Allowed || d.RetryAfterMs != 100 {
		t.Fatalf("over limit: %+v, want retry at the next window (100 ms)", d)
	}
	if _, d, _ = Apply(s, l, 6_000, 10*Micro); !d.Allowed {
		t.Fatalf("next window: %+v", d)
	}
}

func TestSlidingWindowWeightsPreviousWindow(t *testing.T) {
	l := Limits{Algorithm: SlidingWindow, Capacity: 10 * Micro, WindowMs: 1000}
	s, _, _ := Apply(State{}, l, 0, 10*Micro) // window 0 full
	// At 1.25s, 75% of window 0 still overlaps: estimate ceil(7.5) = 7.5 tokens... in micro 7.5M.
	s, d, _ := Apply(s, l, 1_250, 3*Micro)
	if d.Allowed {
		t.Fatalf("at 1.25s 7.5 used, 3 more exceeds 10: %+v", d)
	}
	// 3 fit when prev weight <= 7: (1000-x)/1000*10 <= 7 => x >= 300, i.e. at 1.3s: retry 50 ms.
	if d.RetryAfterMs != 50 {
		t.Fatalf("retry %d, want 50", d.RetryAfterMs)
	}
	if _, d2, _ := Apply(s, l, 1_300, 3*Micro); !d2.Allowed {
		t.Fatalf("at the promised time: %+v", d2)
	}
	if _, d2, _ := Apply(s, l, 1_299, 3*Micro); d2.Allowed {
		t.Fatalf("before the promised time: %+v", d2)
	}
}

// For each algorithm, a request retried after RetryAfterMs is admitted and
// one retried a millisecond earlier is not.
func TestRetryAfterIsExactAllAlgorithms(t *testing.T) {
	for _, l := range []Limits{
		{Algorithm: TokenBucket, Capacity: 10 * Micro, Rate: 3 * Micro},
		{Algorithm: FixedWindow, Capacity: 10 * Micro, WindowMs: 700},
		{Algorithm: SlidingWindow, Capacity: 10 * Micro, WindowMs: 700},
		{Algorithm: SlidingLog, Capacity: 10 * Micro, WindowMs: 700},
	} {
		var s State
		now := int64(10_000)
		for i := 0; i < 200; i++ {
			cost := int64(i%4+1) * Micro
			ns, d, err := Apply(s, l, now, cost)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				if _, d2, _ := Apply(ns, l, now+d.RetryAfterMs, cost); !d2.Allowed {
					t.Fatalf("%s step %d: rejected after promised %d ms", l.Algorithm, i, d.RetryAfterMs)
				}
				if d.RetryAfterMs > 1 {
					if _, d3, _ := Apply(ns, l, now+d.RetryAfterMs-1, cost); d3.Allowed {
						t.Fatalf("%s step %d: admitted 1 ms before the promised %d ms", l.Algorithm, i, d.RetryAfterMs)
					}
				}
			}
			s = ns
			now += int64(i*37%150) + 1
		}
	}
}

func TestSlidingLogIsBounded(t *testing.T) {
	l := Limits{Algorithm: SlidingLog, Capacity: 5 * Micro, WindowMs: 1000}
	var s State
	for now := int64(0); now < 10_000; now += 7 {
		s, _, _ = Apply(s, l, now, Micro)
		if int64(len(s.Log)) > l.Capacity/Micro {
			t.Fatalf("log holds %d entries, limit %d", len(s.Log), l.Capacity/Micro)
		}
	}
}
