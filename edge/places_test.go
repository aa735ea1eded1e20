package edge

import (
	"cmp"
	"slices"
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
			refused = k.Synced(now, now, u, Granted{Reserved: Reserve(u.Want, k.Written, u.Capacity, 0), Places: min(u.Instances, places)}, cfg)
		}
		sent = map[int]bool{}
		for _, s := range k.Push(now, p, t0.Add(time.Hour), cfg) {
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
	if refused := k.Synced(now, now, Update{Instances: 3, Most: 2}, Granted{Reserved: k.Written, Places: 1}, cfg); len(refused) != 0 ||
		!k.Slots[2].Placed || k.Slots[3].Placed || !k.Slots[4].Refused {
		t.Fatalf("a store granting 1 place to slots 2, 3, 4: refused %v, placed 2 %v, 3 %v; want 2 kept, 3 losing its place", refused, k.Slots[2].Placed, k.Slots[3].Placed)
	}
	// A slot that lost its place is abandoned at once: its assignment
	// must not outlive the place into its fallback.
	if sends := k.Push(now, p, t0.Add(time.Hour), cfg); len(sends) == 0 || sends[0].Slot != 3 || !sends[0].Abandon || k.Slots[3] != nil {
		t.Fatalf("after losing a place: %+v, want slot 3 abandoned", sends)
	}

	// The policy's instances lowered to 1 with both places still held:
	// the last placed slot loses its place at the next plan.
	k.Add(5, now)
	k.Synced(now, now, Update{Instances: 3, Most: 2}, Granted{Reserved: k.Written, Places: 2}, cfg)
	if !k.Slots[2].Placed || !k.Slots[4].Placed {
		t.Fatalf("two places for slots 2, 4, 5: placed %v %v", k.Slots[2].Placed, k.Slots[4].Placed)
	}
	p.Edge.Instances = 1
	k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg)
	if sends := k.Push(now, p, t0.Add(time.Hour), cfg); len(sends) == 0 || sends[0].Slot != 4 || !sends[0].Abandon {
		t.Fatalf("instances lowered to 1: %+v, want slot 4 abandoned", sends)
	}

	// A write whose answer was lost: the store may hold the smaller of
	// before and the write, and the next plan writes again.
	k.Unsynced(Update{Want: 0, Instances: 0})
	if k.Places != 0 || k.Written != 0 || k.Slots[2].Placed {
		t.Fatalf("after a lost shrink to nothing: places %d, written %d, slot 2 placed %v", k.Places, k.Written, k.Slots[2].Placed)
	}
	if _, write := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg); !write {
		t.Fatal("the plan after a lost write writes nothing")
	}
}

// A key whose identity is no longer served keeps its places in the store
// until it has written them away.
func TestReleaseFreesPlaces(t *testing.T) {
	p := edgePolicy(t)
	cfg := DefaultConfig()
	k := NewKey[int](cmp.Compare[int])
	capAt := func(time.Time) int64 { return 0 }
	k.Add(1, t0)
	u, _ := k.Plan(t0, p, time.Minute, capAt, 0, Others{}, cfg)
	k.Synced(t0, t0, u, Granted{Places: 1}, cfg)
	k.Remove(1)
	u, write, drop := k.Release(t0, 0, cfg)
	if drop || !write || u.Instances != 0 {
		t.Fatalf("released with a place held: %+v, write %v, drop %v; want the place written away first", u, write, drop)
	}
	k.Synced(t0, t0, u, Granted{}, cfg)
	if _, _, drop := k.Release(t0, 0, cfg); !drop {
		t.Fatal("nothing held, nothing enforced: not dropped")
	}
}

// A slot added while a write was in flight is not refused by its answer:
// the store was not asked for its place. The next plan asks at once.
func TestSlotAddedDuringSyncIsNotRefused(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 4
	cfg := DefaultConfig()
	k := NewKey[int](cmp.Compare[int])
	capAt := func(time.Time) int64 { return p.Limits().Amount() }
	k.Add(1, t0).Report(p, 100, 5*time.Second, t0)
	k.Add(2, t0).Report(p, 100, 5*time.Second, t0)
	u, _ := k.Plan(t0, p, time.Minute, capAt, 0, Others{}, cfg)
	k.Add(3, t0).Report(p, 100, 5*time.Second, t0) // while u is written
	g := Granted{Reserved: Reserve(u.Want, k.Written, u.Capacity, 0), Places: u.Instances}
	if refused := k.Synced(t0, t0, u, g, cfg); len(refused) != 0 || k.Slots[3].Refused {
		t.Fatalf("slot 3 added during the write: refused %v, want none", refused)
	}
	u, write := k.Plan(t0, p, time.Minute, capAt, 0, Others{}, cfg)
	if !write || u.Instances != 3 || !k.Urgent(u) {
		t.Fatalf("next plan: write %v, asks %d places, urgent %v; want 3 asked at once", write, u.Instances, k.Urgent(u))
	}
	if refused := k.Synced(t0, t0, u, Granted{Reserved: g.Reserved, Places: 2}, cfg); len(refused) != 1 || refused[0] != 3 {
		t.Fatalf("the store granting 2 of the 3 asked: refused %v, want slot 3", refused)
	}
}

// Places are shared between the hosts instances run on (Slot.Group) max-min
// fairly: instances that came first from one host hold every place until
// others' instances wait, then give up their last places, abandoned at
// once, until no host holds two more than a host whose instance waits.
// Instances of one host (the ungrouped ones too) keep first come, first
// served among themselves.
func TestPlacesSharedBetweenHosts(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 4
	cfg := DefaultConfig()
	k := NewKey[int](cmp.Compare[int])
	now := t0
	capAt := func(time.Time) int64 { return p.Limits().Amount() }
	add := func(id int, group string) {
		k.Add(id, now).Report(p, 100, 5*time.Second, now)
		k.Slots[id].Group = group
	}
	// round plans, syncs with a store granting the policy's 4 places, and
	// pushes: the slots abandoned.
	round := func() (abandoned []int) {
		t.Helper()
		u, _ := k.Plan(now, p, time.Minute, capAt, 0, Others{}, cfg)
		k.Synced(now, now, u, Granted{Reserved: Reserve(u.Want, k.Written, u.Capacity, 0), Places: min(u.Instances, 4)}, cfg)
		for _, s := range k.Push(now, p, t0.Add(time.Hour), cfg) {
			if s.Abandon {
				abandoned = append(abandoned, s.Slot)
			}
		}
		now = now.Add(cfg.GrowWait)
		return abandoned
	}
	placed := func() map[string]int {
		n := map[string]int{}
		for _, s := range k.Slots {
			if s.Placed {
				n[s.Group]++
			}
		}
		return n
	}
	for id := 1; id <= 6; id++ {
		add(id, "sybil")
	}
	if a := round(); len(a) != 0 || placed()["sybil"] != 4 {
		t.Fatalf("one host's 6 instances: placed %v, abandoned %v; want 4 placed, none abandoned", placed(), a)
	}
	add(7, "h1")
	add(8, "h2")
	if a := round(); len(a) != 2 || !(a[0] == 3 && a[1] == 4 || a[0] == 4 && a[1] == 3) {
		t.Fatalf("two other hosts' instances waiting: abandoned %v, want the first host's last two placed (3, 4)", a)
	}
	if n := placed(); n["sybil"] != 2 || n["h1"] != 1 || n["h2"] != 1 {
		t.Fatalf("places %v, want 2 for the first host, 1 each for the others", n)
	}
	add(9, "sybil")
	add(10, "h3")
	round()
	if n := placed(); n["sybil"] != 1 || n["h1"] != 1 || n["h2"] != 1 || n["h3"] != 1 {
		t.Fatalf("places %v, want one each once a fourth host's instance waits", n)
	}
	add(11, "h1")
	if a := round(); len(a) != 0 || placed()["h1"] != 1 {
		t.Fatalf("a second instance of a host holding one place: abandoned %v, places %v; want it to wait", a, placed())
	}
}

// Free places go first to the hosts holding fewest, and places the store
// takes back come first from the hosts holding most: no slot is placed
// only to be abandoned at once, and a slot placed in a sync is not also
// reported refused by it.
func TestPlacesFillAndShrinkByHost(t *testing.T) {
	p := edgePolicy(t)
	p.Edge.Instances = 8
	cfg := DefaultConfig()
	k := NewKey[int](cmp.Compare[int])
	now := t0
	add := func(id int, group string) { k.Add(id, now).Group = group }
	sync := func(places int64) []int {
		return k.Synced(now, now, Update{Instances: int64(len(k.Slots)), Most: 8}, Granted{Places: places}, cfg)
	}
	placed := func() (ids []int) {
		for _, id := range k.sorted() {
			if k.Slots[id].Placed {
				ids = append(ids, id)
			}
		}
		return ids
	}
	add(1, "a")
	add(2, "a")
	add(3, "b")
	if refused := sync(2); len(refused) != 1 || refused[0] != 2 || !slices.Equal(placed(), []int{1, 3}) || len(k.lost) != 0 {
		t.Fatalf("2 places for a, a, b: refused %v, placed %v, lost %v; want 1 and 3 placed, 2 refused, none lost", refused, placed(), k.lost)
	}
	add(4, "c")
	add(5, "a")
	add(6, "b")
	byHost := func() map[string]int {
		n := map[string]int{}
		for _, id := range placed() {
			n[k.Slots[id].Group]++
		}
		return n
	}
	sync(4)
	if n := byHost(); n["a"] != 2 || n["b"] != 1 || n["c"] != 1 || len(k.lost) != 0 {
		t.Fatalf("4 places for a, a, b, c, a, b: placed %v, lost %v; want 2, 1, 1, none lost", n, k.lost)
	}
	k.Remove(4) // c leaves: its place goes to b, holding fewer than a
	sync(4)
	if n := byHost(); n["a"] != 2 || n["b"] != 2 || len(k.lost) != 0 {
		t.Fatalf("after c left: placed %v, lost %v; want 2 each, none lost", n, k.lost)
	}
	sync(2)
	if n := byHost(); n["a"] != 1 || n["b"] != 1 || len(k.lost) != 2 {
		t.Fatalf("places cut to 2: placed %v, lost %v; want one each, two lost", n, k.lost)
	}
}
