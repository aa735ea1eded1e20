package agent

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// The top-K keeps at most k identities, never underestimates one it keeps
// (count - err <= true count <= count), and keeps every identity heavier
// than the stream's total over k, as space-saving guarantees; decay halves
// the counts and drops the ones that reach zero.
func TestTopKSpaceSaving(t *testing.T) {
	const k = 10
	tk := newTopK(k)
	truth := map[string]int64{}
	r := rand.New(rand.NewPCG(3, 4))
	var total int64
	for i := 0; i < 50_000; i++ {
		id := fmt.Sprint("light-", r.IntN(5000))
		switch r.IntN(10) {
		case 0, 1:
			id = "heavy-a" // 20% of the stream
		case 2:
			id = fmt.Sprint("heavy-", r.IntN(3)) // about 3.3% each
		}
		n := int64(1 + r.IntN(3))
		tk.add(id, n)
		truth[id] += n
		total += n
	}
	top := tk.top()
	if len(top) != k {
		t.Fatalf("%d identities kept, want %d", len(top), k)
	}
	kept := map[string]bool{}
	for i, e := range top {
		kept[e.ID] = true
		c := tk.c[tk.at[e.ID]]
		if tr := truth[e.ID]; c.count < tr || c.count-c.err > tr {
			t.Errorf("%s: count %d (err %d), true count %d", e.ID, c.count, c.err, tr)
		}
		if i > 0 && top[i-1].Count < e.Count {
			t.Errorf("top not heaviest first: %v", top)
		}
	}
	for id, n := range truth {
		if n > total/k && !kept[id] {
			t.Errorf("%s (%d of %d) is above total/k but was dropped", id, n, total)
		}
	}
	if top[0].ID != "heavy-a" {
		t.Errorf("heaviest %s, want heavy-a", top[0].ID)
	}

	tk = newTopK(3)
	tk.add("a", 5)
	tk.add("b", 1)
	tk.add("c", 2)
	tk.decay()
	if got := tk.top(); len(got) != 2 || got[0] != (entry{"a", 2}) || got[1] != (entry{"c", 1}) {
		t.Fatalf("after decay: %v, want a:2 c:1 (b dropped)", got)
	}
	tk.add("d", 1) // takes b's free slot, no eviction
	tk.add("c", 1)
	if got := tk.top(); len(got) != 3 || got[1] != (entry{"c", 2}) || got[2] != (entry{"d", 1}) {
		t.Fatalf("after adds: %v, want a:2 c:2 d:1", got)
	}
}

// BenchmarkTopKAdd counts a stream of mostly new identities into a full
// table, the agent's per-check cost for a policy with many identities.
func BenchmarkTopKAdd(b *testing.B) {
	tk := newTopK(10)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("tenant=t", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tk.add(ids[i%len(ids)], 1)
	}
}
