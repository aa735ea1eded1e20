package edge

import (
	"context"
	"testing"
	"time"
)

// The store in memory ends entries with their agent's life as the
// region's Redis does (regional.TestEdgeEntriesEndWithTheirAgent, the
// same steps on Redis): an entry counts while its agent syncs, however
// long after its write; it ends with the agent's life though written for
// an hour; the others then grow into it; the agent syncing again starts
// another life, in which it grows from none, counting the others. What a
// process succeeding it under its name takes over lasts no longer than
// the life it was written in.
func TestMemStoreEntriesEndWithTheirAgent(t *testing.T) {
	now := int64(1_000_000)
	m := NewMemStore(func() int64 { return now })
	id := ID{Policy: "api", Identity: "acme"}
	const capacity, alive = 1000, 400 * time.Millisecond
	want := func(n int64) []Write {
		return []Write{{ID: id, Update: Update{Want: n, Capacity: capacity, Life: time.Hour}}}
	}
	sync := func(who string, ws []Write) SyncAnswer {
		ans, err := m.Agent(who, "").Sync(context.Background(), ws, true, alive)
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	first := sync("a", want(600))
	if first.Granted[0].Reserved != 600 || first.Life == 0 {
		t.Fatalf("a alone was granted %+v in life %d, want 600 in a life", first.Granted[0], first.Life)
	}
	for range 12 { // 1.2 s, three lives' worth, a syncing every 100 ms
		now += 100
		if l := sync("a", nil).Life; l != first.Life {
			t.Fatalf("a's life changed from %d to %d while it synced", first.Life, l)
		}
		if r := sync("b", nil).Others[id].Reserved; r != 600 {
			t.Fatalf("b sees a holding %d while a syncs, want 600", r)
		}
	}
	now += alive.Milliseconds() - 1
	if r := sync("b", nil).Others[id].Reserved; r != 600 {
		t.Fatalf("b sees a holding %d a ms before its life ends, want 600", r)
	}
	now++
	if r := sync("b", nil).Others[id].Reserved; r != 0 {
		t.Fatalf("b sees a holding %d as its life ends, want none", r)
	}
	if g := sync("b", want(capacity)).Granted[0].Reserved; g != capacity {
		t.Fatalf("b was granted %d once a's life ended, want the whole %d", g, capacity)
	}
	again := sync("a", want(600))
	if again.Life == first.Life || again.Granted[0].Reserved != 0 {
		t.Fatalf("a syncing again was granted %+v in life %d (was %d), want none in another life", again.Granted[0], again.Life, first.Life)
	}
	// b's successor takes over what b holds, for what is left of b's life.
	now += 100
	ans, err := m.Agent("b2", "b").Sync(context.Background(), want(0), true, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if in := ans.Granted[0].Inherited; in.Reserved != capacity || in.Left != alive-100*time.Millisecond {
		t.Fatalf("b's successor took over %+v, want %d for the %s left of b's life", in, capacity, alive-100*time.Millisecond)
	}
}
