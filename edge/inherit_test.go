package edge

import (
	"cmp"
	"math/rand/v2"
	"testing"
	"time"
)

// The pool counts the predecessor's instances not adopted at the largest
// share each and its reservation in all; an adopted slot counts the
// largest share until the pool ends, whatever it is sent; an entry from
// before Largest was kept counts its whole reservation per instance.
func TestPoolCountsThePredecessorsInstances(t *testing.T) {
	for _, c := range []struct {
		name                  string
		in                    Inheritance
		pooled, adopted1, all int64 // committed: at once, one adopted, all adopted
	}{
		{"even", Inheritance{Reserved: 100, Largest: 10, Places: 10}, 100, 100, 100},
		{"uneven", Inheritance{Reserved: 100, Largest: 60, Places: 2}, 100, 120, 120},
		{"unknown largest", Inheritance{Reserved: 100, Places: 2}, 100, 200, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.in.Left = 5 * time.Second
			l := NewLedger[int]()
			l.Inherit(c.in, t0, 1e-4)
			if got := l.Committed(t0); got != c.pooled {
				t.Fatalf("inherited: committed %d, want %d", got, c.pooled)
			}
			l.Adopt(0, t0)
			l.Adopt(0, t0) // once
			if got := l.Committed(t0); got != c.adopted1 {
				t.Fatalf("one adopted: committed %d, want %d", got, c.adopted1)
			}
			for i := 1; i < int(c.in.Places)+3; i++ {
				l.Adopt(i, t0) // beyond the places: not adopted
			}
			if got := l.Committed(t0); got != c.all {
				t.Fatalf("all adopted: committed %d, want %d", got, c.all)
			}
			end := t0.Add(Lifetime(c.in.Left, 1e-4, 0))
			if got := l.Committed(end.Add(-time.Millisecond)); got != c.all {
				t.Fatalf("just before the entry would have expired: committed %d, want %d", got, c.all)
			}
			if got := l.Committed(end); got != 0 {
				t.Fatalf("once the entry would have expired: committed %d, want 0", got)
			}
		})
	}
}

// A restarted agent assigns to its predecessor's instances as their streams
// reopen, from the reservation it took over, without waiting for that
// reservation to expire; and at every round, what each instance may
// enforce (its predecessor's bucket until the successor's first reaches
// it, then the successor's) sums to no more than the successor's
// reservation (a micro-unit an instance: shares round). Instances
// reconnect over a second with demands of their own. Where the
// predecessor's instances had even shares, each gets its bucket as its
// stream reopens; uneven, the largest share counts for every instance the
// successor has not replaced, which is more than the reservation, and
// they wait at most until the predecessor's entry would have expired.
func TestSuccessorAssignsWithinTheInheritance(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 8
	cfg := DefaultConfig()
	cfg.Drift = 1e-4
	capacity := p.Limits().Amount()
	capAt := func(time.Time) int64 { return capacity }
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 3))
		n := 2 + rng.IntN(7)
		// The predecessor, settled on uneven demand.
		a := NewKey[int](cmp.Compare[int])
		now := t0
		even := seed%2 == 0
		for i := range n {
			d := uint64(200)
			if !even {
				d = uint64(10 + rng.IntN(400))
			}
			a.Add(i, now).Report(p, d, time.Second, now)
		}
		var last Update
		for range 40 {
			if u, write := a.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg); write {
				a.Synced(now, now, u, alone(a, u), cfg)
				last = u
			}
			a.Push(now, p, t0.Add(time.Hour), cfg)
			now = now.Add(cfg.Tick)
		}
		held := map[int]int64{} // what each instance enforces: the predecessor's share
		for i := range n {
			share, _ := a.Ledger.Current(i, now)
			held[i] = share
		}
		// Killed; the successor's instances reconnect over a second, with
		// demands of their own.
		b := NewKey[int](cmp.Compare[int])
		in := Inheritance{Reserved: a.Written, Largest: last.Largest, Places: a.Places, Left: Lifetime(a.TTL, cfg.Drift, cfg.Margin),
			Edge: a.Self}
		others, served, inherited := Others{Reserved: a.Written, Edge: a.Self}, 0, false
		due := 2*n + 4 // rounds: the last stream reopens at 2n-2
		if !even {
			due = int((in.Left+cfg.Margin)/cfg.Tick) + 4
		}
		for r := 0; r < 80; r++ {
			if r%2 == 0 && b.Slots[r/2] == nil && r/2 < n {
				b.Add(r/2, now).Report(p, uint64(10+rng.IntN(400)), time.Second, now)
			}
			if u, write := b.Plan(now, p, time.Minute, capAt, 0, others, cfg); write {
				g := Granted{Reserved: Reserve(u.Want, b.Written, u.Capacity, others.Reserved), Places: Reserve(u.Instances, b.Places, u.Most, 0)}
				if !inherited {
					g.Reserved += in.Reserved
					g.Places = Reserve(u.Instances, in.Places, u.Most, 0)
					g.Inherited, others, inherited = in, others.Without(in), true
				}
				b.Synced(now, now, u, g, cfg)
			}
			for _, s := range b.Push(now, p, t0.Add(time.Hour), cfg) {
				if s.Abandon {
					t.Fatalf("seed %d: slot %d abandoned", seed, s.Slot)
				}
				share, _ := b.Ledger.Current(s.Slot, now)
				held[s.Slot] = share
			}
			var sum int64
			for _, h := range held {
				sum += h
			}
			if inherited && sum > b.Written+int64(n) { // a micro-unit an instance: shares round
				t.Fatalf("seed %d, round %d: the instances may enforce %d, the successor reserves %d (%v)", seed, r, sum, b.Written, held)
			}
			if b.Written > a.Written {
				t.Fatalf("seed %d: the successor grew to %d past the %d it took over, with no capacity left", seed, b.Written, a.Written)
			}
			if r == due {
				for i := range n {
					if b.Slots[i].Bucket.Deny() {
						t.Fatalf("seed %d (even %v): instance %d still waits for a bucket %d rounds after its stream reopened (held %v)", seed, even, i, due-2*i, held)
					}
				}
				served++
			}
			now = now.Add(cfg.Tick)
		}
		if served == 0 {
			t.Fatalf("seed %d: never checked", seed)
		}
	}
}
