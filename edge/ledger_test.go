package edge

import (
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

const testTTL = 2 * time.Second

func push(l *Ledger[string], k string, share int64, now time.Time) {
	l.Pushed(k, share, now, now.Add(testTTL), now.Add(testTTL+500*time.Millisecond))
}

// A larger share waits for the reservation; a smaller one goes at once but
// keeps counting until it may have expired.
func TestLedgerTwoPhases(t *testing.T) {
	l := NewLedger[string]()
	now := t0
	if got := l.Plan(now, map[string]int64{"a": 100}, 0, time.Second); len(got) != 0 {
		t.Fatalf("nothing reserved, nothing may grow: %v", got)
	}
	if n := l.Need(now, map[string]int64{"a": 100}); n != 100 {
		t.Fatalf("need %d, want 100", n)
	}
	got := l.Plan(now, map[string]int64{"a": 100}, 60, time.Second)
	if got["a"] != 60 {
		t.Fatalf("growth within what is visible: %v", got)
	}
	push(l, "a", 60, now)
	now = now.Add(1500 * time.Millisecond)
	// Demand moves to b: a shrinks at once, b waits for a's share to expire.
	want := map[string]int64{"a": 0, "b": 60}
	got = l.Plan(now, want, 60, time.Second)
	if got["a"] != 0 || len(got) != 1 {
		t.Fatalf("a shrinks at once, b waits: %v", got)
	}
	push(l, "a", 0, now)
	if c := l.Committed(now); c != 60 {
		t.Fatalf("a's 60 counts until it may have expired, committed %d", c)
	}
	if n := l.Need(now, want); n != 120 {
		t.Fatalf("b's share needs 60 more while a's may live: need %d", n)
	}
	now = t0.Add(testTTL + 500*time.Millisecond) // a's 60 ended
	if c := l.Committed(now); c != 0 {
		t.Fatalf("committed %d after a's share ended", c)
	}
	got = l.Plan(now, want, 60, time.Second)
	if got["b"] != 60 {
		t.Fatalf("b gets a's share once it ended: %v", got)
	}
}

// A slot's assignment changes at most once per interval: a changed bucket
// may start full.
func TestLedgerPacesChanges(t *testing.T) {
	l := NewLedger[string]()
	push(l, "a", 50, t0)
	if got := l.Plan(t0.Add(500*time.Millisecond), map[string]int64{"a": 10}, 100, time.Second); len(got) != 0 {
		t.Fatalf("changed within the interval: %v", got)
	}
	if got := l.Plan(t0.Add(time.Second), map[string]int64{"a": 10}, 100, time.Second); got["a"] != 10 {
		t.Fatalf("not changed after the interval: %v", got)
	}
	// A refresh of the same share is no change.
	push(l, "a", 50, t0.Add(1200*time.Millisecond))
	if got := l.Plan(t0.Add(2*time.Second), map[string]int64{"a": 20}, 100, time.Second); got["a"] != 20 {
		t.Fatalf("a refresh is not a change: %v", got)
	}
}

// A removed slot's shares keep counting until they may have expired.
func TestLedgerRemoveKeepsCounting(t *testing.T) {
	l := NewLedger[string]()
	push(l, "a", 70, t0)
	l.Remove("a")
	if c := l.Committed(t0.Add(time.Second)); c != 70 {
		t.Fatalf("committed %d after the stream ended", c)
	}
	if l.Empty(t0.Add(time.Second)) || !l.Empty(t0.Add(time.Minute)) {
		t.Fatal("empty only once nothing may be enforced")
	}
}

// Whatever wants and reservations come, what may be enforced never grows
// beyond the reservation every agent could see: after each round's
// pushes, Committed is at most max(visible, Committed before).
func TestLedgerNeverBeyondVisible(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for run := 0; run < 200; run++ {
		l := NewLedger[string]()
		now := t0
		keys := []string{"a", "b", "c", "d"}
		var visible int64
		for step := 0; step < 300; step++ {
			now = now.Add(time.Duration(r.IntN(700)) * time.Millisecond)
			want := map[string]int64{}
			for _, k := range keys {
				if r.IntN(5) > 0 {
					want[k] = r.Int64N(200)
				}
			}
			if r.IntN(20) == 0 {
				l.Remove(keys[r.IntN(len(keys))])
			}
			before := l.Committed(now)
			// The agent lowers the reservation to no less than what may
			// still be enforced, and raises it as asked, sometimes not all.
			switch r.IntN(3) {
			case 0:
				visible = max(before, l.Need(now, want)-r.Int64N(50))
			case 1:
				visible = before
			}
			for k, s := range l.Plan(now, want, visible, time.Second) {
				push(l, k, s, now)
			}
			for _, k := range keys {
				if l.Due(k, now, time.Second) {
					if s, ok := l.Current(k, now); ok {
						push(l, k, s, now)
					}
				}
			}
			if after := l.Committed(now); after > max(visible, before) {
				t.Fatalf("run %d step %d: committed %d, visible %d, before %d", run, step, after, visible, before)
			}
		}
	}
}
