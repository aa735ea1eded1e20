package regional

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// Agents growing their reservations for one identity at once, each asking
// for all of the capacity and for three of the policy's four instance
// places, never hold more than either between them (the script grants
// growth atomically); shrinking is granted whole; a process that succeeded
// another under its name takes that one's places and reservation as its
// own; a dead agent's reservation ends by itself when its life
// runs out, and the others see it gone.
func TestEdgeReservationsOnRedis(t *testing.T) {
	rdb, region := edgeRedis(t)
	ctx := context.Background()
	id := edge.ID{Policy: "api", Identity: "acme"}
	const capacity = 1000
	var wg sync.WaitGroup
	granted := make([]edge.Granted, 8)
	for i := range granted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := string(rune('a' + i))
			u := edge.Write{ID: id, Update: edge.Update{Want: capacity, Capacity: capacity, Instances: 3, Most: 4, EdgeDemand: 5, Life: time.Minute}}
			for round := 0; round < 20; round++ {
				g, err := region.EdgeWrite(ctx, EdgeAgent{ID: name}, []edge.Write{u})
				if err != nil {
					t.Error(err)
					return
				}
				granted[i] = g[0]
			}
		}()
	}
	wg.Wait()
	var sum, places int64
	for _, g := range granted {
		sum, places = sum+g.Reserved, places+g.Places
	}
	if sum > capacity || sum < capacity/2 || places != 4 {
		t.Fatalf("agents hold %v, %d in all, of a capacity of %d, and %d places of 4", granted, sum, capacity, places)
	}
	// The others see what each holds.
	ra := newEdgeReader("a", time.Now) // kept: later reads read the log
	others, err := ra.read(ctx, region, EdgeAgent{ID: "a"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o := others[id]; o.Reserved != sum-granted[0].Reserved || o.Edge != 5*7 {
		t.Fatalf("agent a sees %+v, want the others' %d reserved and 35 edge demand", o, sum-granted[0].Reserved)
	}
	// A process succeeding the one that holds most places gets those
	// places (its instances reconnect to it), and none beyond, and its
	// reservation, which it must count (edge.Inheritance); the region's
	// total stays.
	heir := 2 // not a or b, which go on below
	for i, g := range granted[2:] {
		if g.Places > granted[heir].Places || g.Places == granted[heir].Places && g.Reserved > granted[heir].Reserved {
			heir = i + 2
		}
	}
	next := EdgeAgent{ID: "next", Heir: string(rune('a' + heir))}
	g, err := region.EdgeWrite(ctx, next, []edge.Write{{ID: id, Update: edge.Update{Capacity: capacity, Instances: 4, Most: 4, Life: time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	in := g[0].Inherited
	if want := granted[heir]; g[0].Places != want.Places || g[0].Reserved != want.Reserved ||
		in.Reserved != want.Reserved || in.Places != want.Places || in.Left <= 0 || in.Left > time.Minute {
		t.Fatalf("a successor of an agent holding %+v was granted %+v, want its places and reservation, none beyond", want, g[0])
	}
	// Shrinking is granted whole; an agent holding for a short life is
	// gone once it ran out.
	g, _ = region.EdgeWrite(ctx, EdgeAgent{ID: "a"}, []edge.Write{{ID: id, Update: edge.Update{Want: 0, Capacity: capacity, Life: time.Minute}}})
	if g[0] != (edge.Granted{}) {
		t.Fatalf("shrink to 0 granted %+v", g[0])
	}
	if _, err := region.EdgeWrite(ctx, EdgeAgent{ID: "b"}, []edge.Write{{ID: id, Update: edge.Update{Want: granted[1].Reserved, Capacity: capacity, Life: 300 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "b's reservation expiring", func() bool {
		others, err := ra.read(ctx, region, EdgeAgent{ID: "a"}, 0)
		return err == nil && others[id].Reserved == sum-granted[0].Reserved-granted[1].Reserved
	})
	if ttl := rdb.PTTL(ctx, region.Key("edge")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("the region's hash expires in %s, want within the longest life", ttl)
	}
}

// An entry written in an agent's life counts while the agent syncs,
// however long after its write, and ends soon after the agent's last sync
// though written for an hour; the others then grow into what it held. The
// agent syncing again starts another life, in which what it held in the
// last is over: it grows again from none, counting the others.
func TestEdgeEntriesEndWithTheirAgent(t *testing.T) {
	_, region := edgeRedis(t)
	ctx := context.Background()
	id := edge.ID{Policy: "api", Identity: "acme"}
	const capacity, alive = 1000, 400 * time.Millisecond
	store := func(name string) *EdgeStore {
		return region.EdgeStore(func() EdgeAgent { return EdgeAgent{ID: name} }, time.Now, time.Second, time.Second)
	}
	a, b := store("a"), store("b")
	want := func(n int64) []edge.Write {
		return []edge.Write{{ID: id, Update: edge.Update{Want: n, Capacity: capacity, Life: time.Hour}}}
	}
	sync := func(s *EdgeStore, ws []edge.Write) edge.SyncAnswer {
		t.Helper()
		ans, err := s.Sync(ctx, ws, true, alive)
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	first := sync(a, want(600))
	if first.Granted[0].Reserved != 600 || first.Life == 0 {
		t.Fatalf("a alone was granted %+v in life %d, want 600 in a life", first.Granted[0], first.Life)
	}
	for end := time.Now().Add(3 * alive); time.Now().Before(end); time.Sleep(alive / 8) {
		if l := sync(a, nil).Life; l != first.Life {
			t.Fatalf("a's life changed from %d to %d while it synced", first.Life, l)
		}
		if r := sync(b, nil).Others[id].Reserved; r != 600 {
			t.Fatalf("b sees a holding %d while a syncs, want 600", r)
		}
	}
	testenv.WaitFor(t, 5*time.Second, "a's entry ending with its life", func() bool {
		return sync(b, nil).Others[id].Reserved == 0
	})
	if g := sync(b, want(capacity)).Granted[0].Reserved; g != capacity {
		t.Fatalf("b was granted %d once a's life ended, want the whole %d", g, capacity)
	}
	again := sync(a, want(600))
	if again.Life == first.Life || again.Granted[0].Reserved != 0 {
		t.Fatalf("a syncing again was granted %+v in life %d (was %d), want none in another life", again.Granted[0], again.Life, first.Life)
	}
}

// A region's hash of many identities is written and read in short calls:
// updates in batches, the read a page at a time, and a whole read still
// sees every identity the other agents hold.
func TestEdgeReservationsInPages(t *testing.T) {
	_, region := edgeRedis(t)
	ctx := context.Background()
	const n = 5 * edgePage
	updates := make([]edge.Write, n)
	for i := range updates {
		updates[i] = edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: 10, Capacity: 100, EdgeDemand: 1, Life: time.Minute}}
	}
	g, err := region.EdgeWrite(ctx, EdgeAgent{ID: "b"}, updates)
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != n || g[n-1].Reserved != 10 {
		t.Fatalf("%d grants (the last %d); want %d of 10", len(g), g[n-1], n)
	}
	res, err := region.edgeCall(ctx, EdgeAgent{ID: "a"}, 0, nil, edgeRead{mode: "full", from: "0", page: edgePage})
	if err != nil {
		t.Fatal(err)
	}
	if res.next == "0" || len(res.fields) == 0 || len(res.fields) > 2*edgePage {
		t.Fatalf("one call read %d of %d identities (next cursor %q): want one page", len(res.fields), n, res.next)
	}
	others, err := newEdgeReader("a", time.Now).read(ctx, region, EdgeAgent{ID: "a"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != n || others[edge.ID{Policy: "api", Identity: "tenant-7"}].Reserved != 10 {
		t.Fatalf("a whole read saw %d of %d identities", len(others), n)
	}
}

// BenchmarkEdgeRead reads a region's hash of 100,000 identities held by
// another agent, page by page (as the agent's whole reads do) and in one
// call (as it once did), and reports the longest call: how long a
// decision's script may wait behind the read; and reads what changed
// since the last read (the log: the agent's usual read).
func BenchmarkEdgeRead(b *testing.B) {
	_, region := edgeRedis(b)
	ctx := context.Background()
	updates := make([]edge.Write, 100_000)
	for i := range updates {
		updates[i] = edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: 10, Capacity: 100, EdgeDemand: 1, Life: time.Hour}}
	}
	if _, err := region.EdgeWrite(ctx, EdgeAgent{ID: "b"}, updates); err != nil {
		b.Fatal(err)
	}
	for _, page := range []int{edgePage, 1 << 30} {
		name := map[bool]string{true: "pages", false: "one-call"}[page == edgePage]
		b.Run(name, func(b *testing.B) {
			var longest time.Duration
			for b.Loop() {
				for cursor := "0"; ; {
					start := time.Now()
					res, err := region.edgeCall(ctx, EdgeAgent{ID: "a"}, 0, nil, edgeRead{mode: "full", from: cursor, page: page})
					longest = max(longest, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
					if cursor = res.next; cursor == "0" {
						break
					}
				}
			}
			b.ReportMetric(float64(longest.Microseconds())/1000, "longest-call-ms")
		})
	}
	// What the agent does now between whole reads: the log of what changed
	// since its last read (here nothing).
	b.Run("log", func(b *testing.B) {
		r := newEdgeReader("a", time.Now)
		if _, err := r.read(ctx, region, EdgeAgent{ID: "a"}, 0); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := r.read(ctx, region, EdgeAgent{ID: "a"}, 0); err != nil {
				b.Fatal(err)
			}
		}
		if r.wholeReads != 1 {
			b.Fatalf("%d whole reads", r.wholeReads)
		}
	})
}

// A reader reads what changed since its last read, not the whole hash: an
// unchanged hash of 1,000 identities costs no field, three changes (one
// new, one changed, one removed) cost three and show in the sums; a store
// that lost its keys, or a log trimmed past the reader, makes it read
// whole again; an entry that expires unwritten leaves the sums.
func TestEdgeReaderReadsChanges(t *testing.T) {
	rdb, region := edgeRedis(t)
	ctx := context.Background()
	b := EdgeAgent{ID: "b"}
	write := func(life time.Duration, tenants ...int) {
		t.Helper()
		var us []edge.Write
		for _, i := range tenants {
			want := int64(10 + i%7)
			if i < 0 {
				i, want = -i, 0 // removed: nothing reserved, no demand
			}
			us = append(us, edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: want, Capacity: 100, Life: life}})
		}
		if _, err := region.EdgeWrite(ctx, b, us); err != nil {
			t.Fatal(err)
		}
	}
	all := make([]int, 1000)
	for i := range all {
		all[i] = i + 1
	}
	write(time.Minute, all...)
	r := newEdgeReader("a", time.Now)
	read := func() map[edge.ID]edge.Others {
		t.Helper()
		others, err := r.read(ctx, region, EdgeAgent{ID: "a"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return others
	}
	if others := read(); len(others) != 1000 || r.wholeReads != 1 {
		t.Fatalf("first read: %d identities in %d whole reads, want 1000 in 1", len(others), r.wholeReads)
	}
	before := r.fieldsRead
	if others := read(); len(others) != 1000 || r.fieldsRead != before || r.wholeReads != 1 {
		t.Fatalf("an unchanged hash: %d identities, %d fields read, %d whole reads; want 1000, none, 1", len(others), r.fieldsRead-before, r.wholeReads)
	}

	write(time.Minute, 1001, -1)
	write(time.Minute, 2) // tenant-2 from 12 to 12: rewritten, read again
	write(time.Minute, 3)
	others := read()
	if n := r.fieldsRead - before; n != 4 || r.wholeReads != 1 {
		t.Fatalf("four fields written: %d read, %d whole reads; want 4, 1", n, r.wholeReads)
	}
	if _, gone := others[edge.ID{Policy: "api", Identity: "tenant-1"}]; gone || others[edge.ID{Policy: "api", Identity: "tenant-1001"}].Reserved != 10+1001%7 || len(others) != 1000 {
		t.Fatalf("after the changes: %d identities, tenant-1 %v, tenant-1001 %+v", len(others), others[edge.ID{Policy: "api", Identity: "tenant-1"}], others[edge.ID{Policy: "api", Identity: "tenant-1001"}])
	}

	// The reader's own writes cost it nothing.
	before = r.fieldsRead
	own := edge.Write{ID: edge.ID{Policy: "api", Identity: "tenant-1"}, Update: edge.Update{Want: 5, Capacity: 100, Life: time.Minute}}
	if _, err := region.EdgeWrite(ctx, EdgeAgent{ID: "a"}, []edge.Write{own}); err != nil {
		t.Fatal(err)
	}
	if others := read(); len(others) != 1000 || r.fieldsRead != before {
		t.Fatalf("after its own write: %d identities, %d fields read; want 1000, none", len(others), r.fieldsRead-before)
	}

	// A log trimmed past the reader: read whole.
	if err := rdb.HSet(ctx, region.Key("edgeseq"), "floor", 1<<40).Err(); err != nil {
		t.Fatal(err)
	}
	if others := read(); len(others) != 1000 || r.wholeReads != 2 {
		t.Fatalf("a log trimmed past the reader: %d identities, %d whole reads; want 1000, 2", len(others), r.wholeReads)
	}
	// A store that lost its keys: a new epoch, read whole.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	write(time.Minute, 6)
	write(300*time.Millisecond, 5)
	if others := read(); len(others) != 2 || r.wholeReads != 3 {
		t.Fatalf("a store that lost its keys: %d identities, %d whole reads; want 2, 3", len(others), r.wholeReads)
	}
	// An entry that expires unwritten leaves the sums, read from the log.
	testenv.WaitFor(t, 5*time.Second, "b's short entry expiring", func() bool { return len(read()) == 1 })
	if r.wholeReads != 3 {
		t.Fatalf("%d whole reads, want 3", r.wholeReads)
	}
}

// The log holds a member per field, and those of fields removed long ago
// (100,000 writes) are trimmed, so it does not grow with identities that
// come and go; a reader from before the trim reads whole, one from after
// it reads the log.
func TestEdgeLogTrimmed(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 writes")
	}
	rdb, region := edgeRedis(t)
	ctx := context.Background()
	b := EdgeAgent{ID: "b"}
	update := func(tenant int, want int64) edge.Write {
		return edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", tenant)}, Update: edge.Update{Want: want, Capacity: 100, Life: time.Hour}}
	}
	var added, removed []edge.Write
	for i := range 100 {
		added = append(added, update(i, 10))
	}
	for i := range 90 { // 10 stay
		removed = append(removed, update(i, 0))
	}
	if _, err := region.EdgeWrite(ctx, b, added); err != nil {
		t.Fatal(err)
	}
	early := newEdgeReader("a", time.Now) // has not read the removals when they are trimmed
	if _, err := early.read(ctx, region, EdgeAgent{ID: "a"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := region.EdgeWrite(ctx, b, removed); err != nil {
		t.Fatal(err)
	}
	churn := make([]edge.Write, edgeBatch)
	for i := range churn {
		churn[i] = update(99, int64(10+i%2))
	}
	for range 100_000/edgeBatch + 20 {
		if _, err := region.EdgeWrite(ctx, b, churn); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.ZCard(ctx, region.Key("edgelog")).Val(); n != 10 {
		t.Fatalf("the log holds %d members for 10 fields", n)
	}
	others, err := early.read(ctx, region, EdgeAgent{ID: "a"}, 0)
	if err != nil || len(others) != 10 || early.wholeReads != 2 {
		t.Fatalf("a reader from before the trim: %d identities, %d whole reads, %v; want 10, 2", len(others), early.wholeReads, err)
	}
	others, err = early.read(ctx, region, EdgeAgent{ID: "a"}, 0)
	if err != nil || len(others) != 10 || early.wholeReads != 2 {
		t.Fatalf("the same reader after: %d identities, %d whole reads, %v; want 10, 2", len(others), early.wholeReads, err)
	}
}

// A sweep of a large hash while a copy serves goes a few pages a read:
// every read returns the copy kept current by the log, changes made
// during the sweep survive it, and a read that runs out of time keeps the
// copy and its place in the log instead of starting over.
func TestEdgeSweepSpreadsOverReads(t *testing.T) {
	_, region := edgeRedis(t)
	ctx := context.Background()
	b := EdgeAgent{ID: "b"}
	write := func(tenant int, want int64) {
		t.Helper()
		u := edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", tenant)}, Update: edge.Update{Want: want, Capacity: 100, Life: time.Hour}}
		if _, err := region.EdgeWrite(ctx, b, []edge.Write{u}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 3 * edgeSweepPages * edgePage // three reads' worth of pages
	us := make([]edge.Write, n)
	for i := range us {
		us[i] = edge.Write{ID: edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: 10, Capacity: 100, Life: time.Hour}}
	}
	if _, err := region.EdgeWrite(ctx, b, us); err != nil {
		t.Fatal(err)
	}
	r := newEdgeReader("a", time.Now)
	read := func(ctx context.Context) (map[edge.ID]edge.Others, error) {
		return r.read(ctx, region, EdgeAgent{ID: "a"}, 0)
	}
	if others, err := read(ctx); err != nil || len(others) != n || r.wholeReads != 1 {
		t.Fatalf("first read: %d identities, %d whole reads, %v; want %d, 1", len(others), r.wholeReads, err, n)
	}
	r.fullEvery = 0 // a sweep with every read from here
	write(n, 10)    // one more, and one removed, during the sweep
	write(0, 0)
	for i := 0; r.wholeReads == 1; i++ {
		others, err := read(ctx)
		if err != nil || len(others) != n {
			t.Fatalf("read %d of the sweep: %d identities, %v; want the copy's %d", i, len(others), err, n)
		}
		if i > 10 {
			t.Fatal("the sweep never ended")
		}
		if i == 0 && r.sweep == nil {
			t.Fatal("a sweep of 3 reads' pages ended in one read")
		}
	}
	others, _ := read(ctx)
	if _, ok := others[edge.ID{Policy: "api", Identity: fmt.Sprint("tenant-", n)}]; !ok || len(others) != n {
		t.Fatalf("after the sweep: %d identities, the one added during it present %v", len(others), ok)
	}

	r.fullEvery = time.Hour
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	whole := r.wholeReads
	if _, err := read(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read out of time: %v", err)
	}
	write(n+1, 10)
	if others, err := read(ctx); err != nil || len(others) != n+1 || r.wholeReads != whole {
		t.Fatalf("after a read out of time: %d identities, %d whole reads, %v; want %d from the log", len(others), r.wholeReads-whole, err, n+1)
	}
}

// edgeRedis is a client of a fresh redis-server, closed with the test, and
// region us in it.
func edgeRedis(t testing.TB) (*redis.Client, *Region) {
	rdb := redistest.Start(t).Client(t)
	return rdb, NewRegion(rdb, "us")
}

// The store in memory (the simulator's, edge.MemStore) keeps the
// reservations as the script does in Redis: random updates from three
// agent processes (growth, shrinking, demands only, another's capacity,
// instance places, a process succeeding the one before it) go through both,
// and every grant, every sum of the others and every entry must match.
func TestEdgeStoreAsMemStore(t *testing.T) {
	rdb, region := edgeRedis(t)
	ctx := context.Background()
	m := edge.NewMemStore(func() int64 { return 1 }) // standing still: no life ends (a life begun at 0 would read as none)
	id := func(i int) edge.ID { return edge.ID{Policy: "api", Identity: strconv.Itoa(i)} }
	rng := rand.New(rand.NewPCG(7, 8))
	const ids, capacity = 3, 1000
	for step := 0; step < 400; step++ {
		gen := rng.IntN(3)
		who, heir := strconv.Itoa(gen), strconv.Itoa(gen-1)
		var ws []edge.Write
		for i := 0; i < ids; i++ {
			if rng.IntN(3) == 0 {
				continue
			}
			u := edge.Update{Want: rng.Int64N(capacity), Capacity: capacity - rng.Int64N(200), Instances: rng.Int64N(6), Most: 4,
				Largest: rng.Int64N(300), Life: time.Hour}
			if rng.IntN(4) == 0 {
				u.Want = 0
			}
			if rng.IntN(2) == 0 {
				u.EdgeDemand, u.Direct = rng.Int64N(500), rng.Int64N(500)
			}
			ws = append(ws, edge.Write{ID: id(i), Update: u})
		}
		// Agents 0 and 1 write in their lives (which outlast the test),
		// 2 does not: entries of both kinds side by side.
		alive := time.Hour
		if gen == 2 {
			alive = 0
		}
		ans, err := m.Agent(who, heir).Sync(ctx, ws, true, alive)
		want, wantOthers := ans.Granted, ans.Others
		if err != nil {
			t.Fatal(err)
		}
		// The read after the writes, as the model's, by a store of its own,
		// so that it reads whole.
		store := func() *EdgeStore {
			return region.EdgeStore(func() EdgeAgent { return EdgeAgent{who, heir} }, time.Now, time.Minute, time.Minute)
		}
		ans, err = store().Sync(ctx, ws, false, alive)
		got := ans.Granted
		if err != nil {
			t.Fatal(err)
		}
		ans, err = store().Sync(ctx, nil, true, alive)
		others := ans.Others
		if err != nil {
			t.Fatal(err)
		}
		// What moved from the process before is compared but for its time
		// left: the model's clock is not Redis's.
		for i := range got {
			got[i].Inherited.Left, want[i].Inherited.Left = 0, 0
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d, agent %s: the model granted %v, the script %v", step, who, want, got)
		}
		if !maps.Equal(others, wantOthers) {
			t.Fatalf("step %d: the model sums %v, the script %v", step, wantOthers, others)
		}
		// Every process's reservation and places, as stored.
		stored := map[edge.ID]map[string]edge.Holding{}
		for f, v := range rdb.HGetAll(ctx, region.Key("edge")).Val() {
			k, _ := parseEdgeField(f)
			stored[k] = map[string]edge.Holding{}
			for _, line := range strings.Split(v, "\n") {
				var who string
				var h edge.Holding
				var e, d, exp int64
				if _, err := fmt.Sscan(line, &who, &h.Reserved, &e, &d, &exp, &h.Places, &h.Largest); err != nil {
					t.Fatalf("entry %q: %v", line, err)
				}
				stored[k][who] = h
			}
		}
		if model := m.Holdings(); !maps.EqualFunc(stored, model, maps.Equal) {
			t.Fatalf("step %d: the model holds %v, the script %v", step, model, stored)
		}
	}
}
