package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// Agents growing their reservations for one identity at once, each asking
// for all of the capacity, never hold more than it between them (the
// script grants growth atomically); shrinking is granted whole; a dead
// agent's reservation ends by itself when its life runs out, and the
// others see it gone.
func TestEdgeReservationsOnRedis(t *testing.T) {
	rs := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := context.Background()
	id := edgeKeyID{"api", "acme"}
	const capacity = 1000
	var wg sync.WaitGroup
	granted := make([]int64, 8)
	for i := range granted {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 20; round++ {
				g, _, err := edgeSync(ctx, rdb, "us", string(rune('a'+i)), []edgeUpdate{{key: id, Update: edge.Update{Want: capacity, Capacity: capacity, EdgeDemand: 5, Life: time.Minute}}})
				if err != nil {
					t.Error(err)
					return
				}
				granted[i] = g[0]
			}
		}()
	}
	wg.Wait()
	var sum int64
	for _, g := range granted {
		sum += g
	}
	if sum > capacity || sum < capacity/2 {
		t.Fatalf("agents hold %v, %d in all, of a capacity of %d", granted, sum, capacity)
	}
	// The others see what each holds.
	_, others, err := edgeSync(ctx, rdb, "us", "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := others[id]; o.Reserved != sum-granted[0] || o.Edge != 5*7 {
		t.Fatalf("agent a sees %+v, want the others' %d reserved and 35 edge demand", o, sum-granted[0])
	}
	// Shrinking is granted whole; an agent holding for a short life is
	// gone once it ran out.
	g, _, _ := edgeSync(ctx, rdb, "us", "a", []edgeUpdate{{key: id, Update: edge.Update{Want: 0, Capacity: capacity, Life: time.Minute}}})
	if g[0] != 0 {
		t.Fatalf("shrink to 0 granted %d", g[0])
	}
	if _, _, err := edgeSync(ctx, rdb, "us", "b", []edgeUpdate{{key: id, Update: edge.Update{Want: granted[1], Capacity: capacity, Life: 300 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "b's reservation expiring", func() bool {
		_, others, err := edgeSync(ctx, rdb, "us", "a", nil)
		return err == nil && others[id].Reserved == sum-granted[0]-granted[1]
	})
	if ttl := rdb.PTTL(ctx, edgeReservationsKey("us")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("the region's hash expires in %s, want within the longest life", ttl)
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
