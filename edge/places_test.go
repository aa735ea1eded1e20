package edge

import (
	"cmp"
	"testing"
	"time"
)

// A key assigns only to the slots holding one of the places the store
// granted: a slot beyond them is refused once (reported by Synced), takes
// no part in the split and is sent nothing; a place freed by a slot that
// leaves goes to it at the next plan, without waiting for the store; a
// store that lost the entry and grants fewer takes places from the last
// slots, not the first.
func TestKeyPlaces(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 2
	cfg := DefaultConfig()
	k := NewKey[int](cmp.Compare[int])
	now := t0
	capAt := func(time.Time) int64 { return p.Limits().Amount() }
	round := func(places int64) (refused []int, sent map[int]bool) {
		t.Helper()
		u, write := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg)
		if write {
			if u.Instances != int64(len(k.Slots)) || u.Most != 2 {
				t.Fatalf("update asks %d places of %d, want one per slot (%d) of the policy's 2", u.Instances, u.Most, len(k.Slots))
			}
			refused = k.Synced(now, now, u, Granted{Reserve(u.Want, k.Written, u.Capacity, 0), min(u.Instances, places)}, cfg)
		}
		sent = map[int]bool{}
		for _, s := range k.Push(now, p, cfg) {
			sent[s.Slot] = true
		}
		now = now.Add(cfg.GrowWait)
		return refused, sent
	}
	for id := 1; id <= 3; id++ {
		k.Add(id, now).Report(p, 100, 5*time.Second, now)
	}
	if refused, _ := round(2); len(refused) != 1 || refused[0] != 3 {
		t.Fatalf("three slots, two places: refused %v, want slot 3", refused)
	}
	refused, sent := round(2)
	if len(refused) != 0 || !sent[1] || !sent[2] || sent[3] {
		t.Fatalf("second round: refused %v again, sent to %v; want 1 and 2 assigned, 3 sent nothing and not refused twice", refused, sent)
	}
	if k.Want[3] != 0 || k.Want[1] <= 0 || k.Want[1] != k.Want[2] {
		t.Fatalf("split %v: the refused slot takes no part", k.Want)
	}

	k.Remove(1)
	u, _ := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg)
	if !k.Slots[3].Placed || k.Slots[3].Refused || u.Instances > k.Places {
		t.Fatalf("slot 1 left: slot 3 placed %v (refused %v), asks %d places holding %d; want the freed place taken without asking", k.Slots[3].Placed, k.Slots[3].Refused, u.Instances, k.Places)
	}

	k.Add(4, now)
	if refused, _ := round(2); len(refused) != 1 || refused[0] != 4 {
		t.Fatalf("a new slot with both places held: refused %v, want slot 4", refused)
	}
	if refused := k.Synced(now, now, Update{Instances: 3, Most: 2}, Granted{Reserved: k.Written, Places: 1}, cfg); len(refused) != 1 || refused[0] != 3 ||
		!k.Slots[2].Placed || !k.Slots[4].Refused {
		t.Fatalf("a store granting 1 place to slots 2, 3, 4: refused %v, placed 2 %v, 4 refused %v; want 2 kept, 3 newly refused", refused, k.Slots[2].Placed, k.Slots[4].Refused)
	}
}
