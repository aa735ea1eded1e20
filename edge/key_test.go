package edge

import (
	"cmp"
	"math"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

func edgePolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
	p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny}
	return p
}

// alone is what the region's store grants u, written for k by an agent
// alone in its region (regional/lua/edge_sync.lua, edge.Reserve).
func alone[K comparable](k *Key[K], u Update) Granted {
	return Granted{Reserved: Reserve(u.Want, k.Written, u.Capacity, 0), Places: Reserve(u.Instances, k.Places, u.Most, 0)}
}

// One key's rounds, as an agent runs them: a reservation is used only
// GrowWait after it was written; the split follows reported demand; when
// demand moves, the old slot shrinks at once and the new one grows only
// once the old assignment may have expired; an idle slot is abandoned.
func TestKeyRounds(t *testing.T) {
	p := edgePolicy(t)
	cfg := DefaultConfig()
	cfg.Drift = 1e-4
	k := NewKey[int](cmp.Compare[int])
	now := t0
	capacity := p.Limits().Amount()
	capAt := func(time.Time) int64 { return capacity }
	round := func() []Send[int] {
		t.Helper()
		if u, write := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg); write {
			k.Synced(now, now, u, alone(k, u), cfg)
		}
		return k.Push(now, p, t0.Add(time.Hour), cfg)
	}
	k.Add(1, now)
	if got := round(); len(got) != 0 || k.Written != capacity {
		t.Fatalf("first round: sent %v, reserved %d: the reservation is written, and used only GrowWait later", got, k.Written)
	}
	now = now.Add(cfg.GrowWait)
	got := round()
	if len(got) != 1 || got[0].Slot != 1 || got[0].Bucket.Deny() || got[0].TTL != p.Edge.EdgeTTL() {
		t.Fatalf("after GrowWait: %+v, want slot 1's bucket for the policy's TTL, %s", got, p.Edge.EdgeTTL())
	}
	if r := got[0].Bucket.Rate(); r < 0.9*100 || r > 100 {
		t.Fatalf("a lone slot gets nearly the whole rate: %v", r)
	}
	// Demand moves to slot 2 (slot 1 reports nothing), once slot 1's
	// assignment may change again.
	now = now.Add(cfg.ChangeEvery)
	k.Slots[1].Report(p, 0, 5*time.Second, now)
	k.Add(2, now).Report(p, 500, 5*time.Second, now)
	got = round()
	if len(got) != 1 || got[0].Slot != 1 || !got[0].Bucket.Deny() {
		t.Fatalf("demand moved: %+v, want slot 1 shrunk at once (slot 2 waits)", got)
	}
	for i := 0; i < 60 && k.Slots[2].Bucket.MaxTokens == 0; i++ {
		now = now.Add(cfg.Tick)
		round()
		if k.Slots[2].Bucket.MaxTokens != 0 && now.Before(t0.Add(cfg.GrowWait).Add(Lifetime(p.Edge.EdgeTTL(), cfg.Drift, cfg.Margin))) {
			t.Fatalf("slot 2 grew at %s, before slot 1's assignment may have expired", now.Sub(t0))
		}
	}
	if k.Slots[2].Bucket.MaxTokens == 0 {
		t.Fatal("slot 2 never got the share")
	}
	// Slot 1 stays idle: abandoned after AbandonAfter; slot 2 keeps
	// reporting requests.
	for end := now.Add(2 * cfg.AbandonAfter); k.Slots[1] != nil && now.Before(end); now = now.Add(cfg.Tick) {
		if now.Sub(k.Slots[2].At) >= 5*time.Second {
			k.Slots[2].Report(p, 500, 5*time.Second, now)
		}
		round()
	}
	if k.Slots[1] != nil || k.Slots[2] == nil {
		t.Fatal("the idle slot was kept, or the busy one abandoned")
	}
	// Nothing reported any more: released once nothing may be enforced.
	k.Remove(2)
	for i := 0; ; i++ {
		u, write, drop := k.Release(now, 0, cfg)
		if drop {
			break
		}
		if write {
			k.Synced(now, now, u, Granted{Reserved: u.Want, Places: u.Instances}, cfg)
		}
		if now = now.Add(time.Second); i > 20 {
			t.Fatal("a key with no slots is never dropped")
		}
	}
}

// Wants counts an unknown demand as the mean of the known, or all of the
// capacity when none is known.
func TestWants(t *testing.T) {
	self, shares := Wants(1000, 0, 0, []int64{-1})
	if self != 1000 || shares[0] != 1000 {
		t.Fatalf("a lone new slot: self %d, shares %v", self, shares)
	}
	self, shares = Wants(1000, 0, 0, []int64{600, -1})
	if self != 1200 || shares[0] != 500 || shares[1] != 500 {
		t.Fatalf("a new slot beside a known one: self %d, shares %v", self, shares)
	}
	if _, shares = Wants(1000, 1000, 0, []int64{1000}); shares[0] != 500 {
		t.Fatalf("direct demand takes its part: %v", shares)
	}
}

// What direct checks leave the edge, and when a renewal holds its grant.
func TestView(t *testing.T) {
	var none *View
	if none.Reserved("p", "a", t0, time.Second) != math.MaxInt64 || none.Holds("p", lease.Grant{}, t0, time.Second) {
		t.Fatal("no view: everything reserved, nothing held")
	}
	v := NewView(t0, map[ID]Others{{"p", "a"}: {Reserved: 300}}, map[ID]int64{{"p", "a"}: 200, {"p", "b"}: 0})
	if r := v.Reserved("p", "a", t0.Add(time.Second), time.Second); r != 500 {
		t.Fatalf("reserved %d, want 500", r)
	}
	if r := v.Reserved("p", "a", t0.Add(time.Second+1), time.Second); r != math.MaxInt64 {
		t.Fatalf("a stale view reserves everything, got %d", r)
	}
	if !v.Holds("p", lease.Grant{Amount: 400}, t0, time.Second) || v.Holds("p", lease.Grant{Amount: 500}, t0, time.Second) {
		t.Fatal("a grant below the reservation is held, one that covers it is not")
	}
	if DirectShare(1000, 400) != 600 || DirectShare(300, 400) != 0 || DirectShare(-1, 5) != -1 {
		t.Fatal("DirectShare")
	}
}

// The reservation script's rule: shrinking is granted whole, growth up to
// the capacity the others leave, never below what the agent holds.
func TestReserve(t *testing.T) {
	for _, c := range []struct{ want, old, capacity, others, got int64 }{
		{100, 500, 1000, 900, 100}, // a smaller want, whole
		{800, 100, 1000, 500, 500}, // growth within what the others leave
		{800, 300, 1000, 900, 300}, // no room: keeps what it holds
		{-5, 0, 1000, 0, 0},
	} {
		if got := Reserve(c.want, c.old, c.capacity, c.others); got != c.got {
			t.Errorf("Reserve(%d, %d, %d, %d) = %d, want %d", c.want, c.old, c.capacity, c.others, got, c.got)
		}
	}
}
