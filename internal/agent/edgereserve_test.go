package agent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// Agents growing their reservations for one identity at once, each asking
// for all of the capacity and for three of the policy's four instance
// places, never hold more than either between them (the script grants
// growth atomically); shrinking is granted whole; a process that succeeded
// another under its name takes that one's places as its own, not its
// reservation; a dead agent's reservation ends by itself when its life
// runs out, and the others see it gone.
func TestEdgeReservationsOnRedis(t *testing.T) {
	rs := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := context.Background()
	id := edgeKeyID{"api", "acme"}
	const capacity = 1000
	var wg sync.WaitGroup
	granted := make([]edge.Granted, 8)
	for i := range granted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 20; round++ {
				g, _, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: string(rune('a' + i))}, []edgeUpdate{{key: id, Update: edge.Update{Want: capacity, Capacity: capacity, Instances: 3, Most: 4, EdgeDemand: 5, Life: time.Minute}}}, true)
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
	_, others, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "a"}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if o := others[id]; o.Reserved != sum-granted[0].Reserved || o.Edge != 5*7 {
		t.Fatalf("agent a sees %+v, want the others' %d reserved and 35 edge demand", o, sum-granted[0].Reserved)
	}
	// A process succeeding the one that holds most places gets those
	// places (its instances reconnect to it), and none beyond; the
	// reservation it succeeded still counts.
	heir := 0
	for i, g := range granted {
		if g.Places > granted[heir].Places {
			heir = i
		}
	}
	next := edgeAgent{id: "next", heir: string(rune('a' + heir))}
	g, _, err := edgeSync(ctx, ctx, rdb, "us", next, []edgeUpdate{{key: id, Update: edge.Update{Want: capacity, Capacity: capacity, Instances: 4, Most: 4, Life: time.Minute}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := granted[heir].Places; g[0].Places != want || g[0].Reserved != 0 {
		t.Fatalf("a successor of an agent holding %d places was granted %+v, want its places and no reservation", want, g[0])
	}
	// Shrinking is granted whole; an agent holding for a short life is
	// gone once it ran out.
	g, _, _ = edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "a"}, []edgeUpdate{{key: id, Update: edge.Update{Want: 0, Capacity: capacity, Life: time.Minute}}}, true)
	if g[0] != (edge.Granted{}) {
		t.Fatalf("shrink to 0 granted %+v", g[0])
	}
	if _, _, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "b"}, []edgeUpdate{{key: id, Update: edge.Update{Want: granted[1].Reserved, Capacity: capacity, Life: 300 * time.Millisecond}}}, true); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "b's reservation expiring", func() bool {
		_, others, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "a"}, nil, true)
		return err == nil && others[id].Reserved == sum-granted[0].Reserved-granted[1].Reserved
	})
	if ttl := rdb.PTTL(ctx, edgeReservationsKey("us")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("the region's hash expires in %s, want within the longest life", ttl)
	}
}

// A region's hash of many identities is written and read in short calls:
// updates in batches, the read a page at a time, and a whole read still
// sees every identity the other agents hold.
func TestEdgeReservationsInPages(t *testing.T) {
	rs := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := context.Background()
	const n = 5 * edgePage
	updates := make([]edgeUpdate, n)
	for i := range updates {
		updates[i] = edgeUpdate{key: edgeKeyID{"api", fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: 10, Capacity: 100, EdgeDemand: 1, Life: time.Minute}}
	}
	g, others, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "b"}, updates, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != n || g[n-1].Reserved != 10 || others != nil {
		t.Fatalf("%d grants (the last %d), others %v; want %d of 10 and no read", len(g), g[n-1], others, n)
	}
	_, page, next, err := edgeCall(ctx, rdb, "us", edgeAgent{id: "a"}, nil, "0", edgePage)
	if err != nil {
		t.Fatal(err)
	}
	if next == "0" || len(page) == 0 || len(page) > 2*edgePage {
		t.Fatalf("one call read %d of %d identities (next cursor %q): want one page", len(page), n, next)
	}
	_, others, err = edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "a"}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(others) != n || others[edgeKeyID{"api", "tenant-7"}].Reserved != 10 {
		t.Fatalf("a whole read saw %d of %d identities", len(others), n)
	}
}

// An agent does not acknowledge a grant smaller than what the region's
// edge reserved for some identity, as long as its view of them is fresh;
// one whose view is stale holds any grant while the edge reserves
// anything.
func TestEdgeHoldsShrinkingGrant(t *testing.T) {
	a := &Agent{cfg: DefaultConfig(), m: newMetrics()}
	e := newEdgeEngine(a, DefaultEdgeConfig())
	on := map[string]bool{"api": true}
	e.enabled.Store(&on)
	now := time.Now()
	v := edge.NewView(now)
	v.Add("api", "acme", 500)
	e.view.Store(v)
	for _, c := range []struct {
		g    lease.Grant
		at   time.Time
		hold bool
	}{
		{lease.Grant{Amount: 400}, now, true},
		{lease.Grant{Amount: 500}, now, false},
		{lease.Grant{Amount: 100, Identities: map[string]int64{"acme": 600}}, now, false},
		{lease.Grant{Amount: 1000}, now.Add(time.Minute), true}, // stale view
	} {
		if got := e.holds("api", c.g, c.at); got != c.hold {
			t.Errorf("grant %+v at +%s: holds %v, want %v", c.g, c.at.Sub(now), got, c.hold)
		}
	}
	if e.holds("other", lease.Grant{}, now) {
		t.Error("a policy the edge does not serve is never held")
	}
	if r := e.reserved("api", "acme", now); r != 500 {
		t.Errorf("direct checks leave %d, want 500", r)
	}
	if r := e.reserved("api", "acme", now.Add(time.Minute)); r < 1<<62 {
		t.Errorf("a stale view leaves direct checks %d reserved, want everything", r)
	}
}

// BenchmarkEdgeRead reads a region's hash of 100,000 identities held by
// another agent, page by page (as the agent does) and in one call (as it
// did), and reports the longest call: how long a decision's script may
// wait behind the read.
func BenchmarkEdgeRead(b *testing.B) {
	rs := startRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := context.Background()
	updates := make([]edgeUpdate, 100_000)
	for i := range updates {
		updates[i] = edgeUpdate{key: edgeKeyID{"api", fmt.Sprint("tenant-", i)}, Update: edge.Update{Want: 10, Capacity: 100, EdgeDemand: 1, Life: time.Hour}}
	}
	if _, _, err := edgeSync(ctx, ctx, rdb, "us", edgeAgent{id: "b"}, updates, false); err != nil {
		b.Fatal(err)
	}
	for _, page := range []int{edgePage, 1 << 30} {
		name := map[bool]string{true: "pages", false: "one-call"}[page == edgePage]
		b.Run(name, func(b *testing.B) {
			var longest time.Duration
			for b.Loop() {
				for cursor := "0"; ; {
					start := time.Now()
					_, _, next, err := edgeCall(ctx, rdb, "us", edgeAgent{id: "a"}, nil, cursor, page)
					longest = max(longest, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
					if cursor = next; cursor == "0" {
						break
					}
				}
			}
			b.ReportMetric(float64(longest.Microseconds())/1000, "longest-call-ms")
		})
	}
}
