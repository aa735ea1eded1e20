package edge

import (
	"cmp"
	"testing"
	"time"
)

// A region share that moves by a few percent moves each instance's bucket
// by about as much, at once and after: no instance's rate falls below
// what the smaller share allows it (it used to: a 50 -> 48 share cut six
// of ten instances to a bucket of one token refilled once a minute for
// about 2 s), and the assigned total stays within the reservation.
func TestSmallShareMoveMovesBucketsLittle(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 10
	cfg := DefaultConfig()
	cfg.Drift = 1e-4
	capacity := p.Limits().Amount() / 2
	capAt := func(time.Time) int64 { return capacity }
	k := NewKey[int](cmp.Compare[int])
	now := t0
	for i := range 10 {
		k.Add(i, now).Report(p, 100, time.Second, now)
	}
	round := func() {
		if u, write := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg); write {
			k.Synced(now, now, u, alone(k, u), cfg)
		}
		k.Push(now, p, t0.Add(time.Hour), cfg)
		now = now.Add(cfg.Tick)
	}
	for range 300 { // 30 s: settled, the buckets grown
		if now.Sub(k.Slots[0].At) >= time.Second {
			for i := range 10 {
				k.Slots[i].Report(p, 100, time.Second, now)
			}
		}
		round()
	}
	before := make([]float64, 10)
	for i := range 10 {
		before[i] = k.Slots[i].Bucket.Rate()
	}
	capacity = capacity * 96 / 100
	for r := range 100 {
		if now.Sub(k.Slots[0].At) >= time.Second {
			for i := range 10 {
				k.Slots[i].Report(p, 100, time.Second, now)
			}
		}
		round()
		for i := range 10 {
			if got := k.Slots[i].Bucket.Rate(); got < 0.9*before[i] {
				t.Fatalf("round %d after the share moved 4%%: instance %d's rate %.2f, was %.2f", r, i, got, before[i])
			}
		}
	}
}
