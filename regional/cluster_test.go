package regional

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// Every slot's birth marker hashes to that slot (pure).
func TestSlotBornKeysInTheirSlots(t *testing.T) {
	for slot := 0; slot < ClusterSlots; slot++ {
		if got := KeySlot(SlotBornKey(slot)); got != slot {
			t.Fatalf("SlotBornKey(%d) = %q is in slot %d", slot, SlotBornKey(slot), got)
		}
	}
}

// clusterEngine is an engine on a real Redis Cluster of three masters
// under ps, pipelined, deciding on the Redis server clock as in
// production.
func clusterEngine(tb testing.TB, ps []*policy.Policy) (*redistest.Cluster, *redis.ClusterClient, *Engine) {
	tb.Helper()
	c := redistest.StartCluster(tb, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { rdb.Close() })
	eng := newEngine(tb, rdb, ps, Config{Pipelines: 2}) // concurrent checks share script calls per slot
	tb.Cleanup(eng.Close)
	if err := eng.LoadScripts(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return c, rdb, eng
}

// KeySlot agrees with the cluster's own CLUSTER KEYSLOT on state keys,
// idempotency keys and markers.
func TestKeySlotMatchesRedisCluster(t *testing.T) {
	_, rdb, eng := clusterEngine(t, testPolicies(t))
	p, _ := eng.Policy("tb")
	for i := 0; i < 200; i++ {
		id, _ := p.IdentityOf(map[string]string{"tenant": fmt.Sprintf("t-%d{x}:%d", i, i*7)})
		k, _ := StateKey(p, id)
		ik := idempotencyKey(k, "retry-1")
		for _, key := range []string{k, ik, SlotBornKey(i * 81)} {
			want, err := rdb.ClusterKeySlot(t.Context(), key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := KeySlot(key); int64(got) != want {
				t.Fatalf("KeySlot(%q) = %d, Redis says %d", key, got, want)
			}
		}
	}
}

// On a cluster the engine is as exact as on one node: identities spread
// over all three masters each get exactly their burst, concurrently, in
// single checks and batches, with and without idempotency keys, for a
// token bucket and a fixed window (counted, and scripted with a key); and a
// master restarted empty mints no new burst for the identities it served.
func TestClusterExactAndLosesNoBurst(t *testing.T) {
	c, rdb, eng := clusterEngine(t, testPolicies(t))
	// A deadline of its own: a call without one gets the pipeline's 1 s,
	// which 180 racers under -race on a loaded machine can outlast (a
	// timed-out check is an error here, not a decision).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const tenants, burst = 60, 20
	limits := []policy.Limits{
		{Algorithm: policy.TokenBucket, Capacity: burst * policy.Micro, Rate: policy.Micro / 100}, // no refill to speak of
		{Algorithm: policy.FixedWindow, Capacity: burst * policy.Micro, WindowMs: 24 * 3_600_000}, // one window, unless a day begins
	}
	req := func(l *policy.Limits, i int, idem string) Request {
		return Request{Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": fmt.Sprint("t", i)}, Cost: 1, Limits: l, IdempotencyKey: idem}
	}
	for _, l := range limits {
		var admitted [tenants]atomic.Int64
		exact := func() {
			var wg sync.WaitGroup
			for i := 0; i < tenants; i++ {
				for r := 0; r < 3; r++ {
					wg.Go(func() {
						for j := 0; j < 10; j++ {
							if r == 0 { // one racer in batches of two
								for _, res := range eng.CheckBatch(ctx, []Request{req(&l, i, ""), req(&l, i, fmt.Sprint("k", j))}) {
									if res.Err != nil {
										t.Error(res.Err)
										return
									}
									if res.Decision.Allowed {
										admitted[i].Add(1)
									}
								}
								continue
							}
							d, err := eng.Check(ctx, req(&l, i, ""))
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted[i].Add(1)
							}
						}
					})
				}
			}
			wg.Wait()
		}
		if l.Algorithm != policy.FixedWindow {
			exact()
		} else if !inOneWindow(t, rdb, l.WindowMs, exact) {
			t.Logf("%s: a window began during the run; its counts are not compared", l.Algorithm)
			continue
		}
		nodes := map[string]bool{}
		p, _ := eng.Policy(algPolicy[l.Algorithm])
		for i := range admitted {
			if got := admitted[i].Load(); got != burst {
				t.Fatalf("%s, tenant %d: %d admitted of 40 asked, want exactly its burst %d", l.Algorithm, i, got, burst)
			}
			id, _ := p.IdentityOf(map[string]string{"tenant": fmt.Sprint("t", i)})
			k, _ := StateKey(p, id)
			n, err := rdb.MasterForKey(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			nodes[n.Options().Addr] = true
		}
		if len(nodes) != 3 {
			t.Fatalf("the tenants' keys live on %d masters, want all 3: the test does not spread", len(nodes))
		}
		// One batch over every tenant spans slots and masters (and more than
		// one script call's worth): each is decided, and rejected.
		all := make([]Request, tenants)
		for i := range all {
			all[i] = req(&l, i, "")
		}
		for i, res := range eng.CheckBatch(ctx, all) {
			if res.Err != nil || res.Decision.Allowed {
				t.Fatalf("%s, tenant %d in a batch over all tenants: %+v %v, want a rejection", l.Algorithm, i, res.Decision, res.Err)
			}
		}
	}
	if born, err := eng.StoreBorn(ctx); err != nil || born != 0 {
		t.Fatalf("store born %d %v, want a new store (0)", born, err)
	}

	// Restart the master holding tenant t0 empty: its keys and its slots'
	// markers are gone. Each lost tenant starts as if it had used its burst.
	p, _ := eng.Policy("tb")
	id0, _ := p.IdentityOf(map[string]string{"tenant": "t0"})
	k0, _ := StateKey(p, id0)
	victim, _ := rdb.MasterForKey(ctx, k0)
	for _, n := range c.Nodes {
		if n.Addr == victim.Options().Addr {
			if err := n.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitClusterKey(t, rdb, k0)
	for _, l := range limits {
		p, _ := eng.Policy(algPolicy[l.Algorithm])
		lost := 0
		for i := 0; i < tenants; i++ {
			id, _ := p.IdentityOf(map[string]string{"tenant": fmt.Sprint("t", i)})
			k, _ := StateKey(p, id)
			if n, _ := rdb.MasterForKey(ctx, k); n.Options().Addr != victim.Options().Addr {
				continue
			}
			lost++
			for j := 0; j < 5; j++ {
				d, err := eng.Check(ctx, req(&l, i, ""))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					t.Fatalf("%s, tenant %d admitted right after its master restarted empty: a fresh burst was minted", l.Algorithm, i)
				}
			}
		}
		if lost == 0 {
			t.Fatalf("%s: no tenant lived on the restarted master", l.Algorithm)
		}
		t.Logf("%s: %d tenants lost with one master; none admitted again", l.Algorithm, lost)
	}
	born, err := eng.StoreBorn(ctx)
	if err != nil || born == 0 {
		t.Fatalf("after the loss the store's birth is %d %v, want the moment of the loss", born, err)
	}
	t.Logf("birth marker moved to %v", time.UnixMilli(born).UTC())
}

// waitClusterKey waits until key's slot answers again after a node restart.
func waitClusterKey(t *testing.T, rdb *redis.ClusterClient, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Exists(ctx, key).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster never served %s again: %v", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkHotKeyShards checks one hot identity from 16 callers on a
// 3-master cluster, on one key and split into 3 shards: it reports
// decisions/s and how much of the Redis time the busiest master spent
// (INFO commandstats), which is all of it on one key.
func BenchmarkHotKeyShards(b *testing.B) {
	for _, shards := range []int{1, 3} {
		b.Run(fmt.Sprint(shards, "-shards"), func(b *testing.B) {
			ps := testenv.MustPolicies(b, fmt.Sprintf("name: hot\nidentity: [tenant]\nlimit: 1000000\nperiod: 1s\nshards: %d\n", shards))
			c, _, eng := clusterEngine(b, ps)
			req := Request{Policy: "hot", Attributes: map[string]string{"tenant": "everyone"}, Cost: 1}
			nodes := make([]*redis.Client, len(c.Nodes))
			for i, n := range c.Nodes {
				nodes[i] = redis.NewClient(&redis.Options{Addr: n.Addr})
				defer nodes[i].Close()
				nodes[i].ConfigResetStat(b.Context())
			}
			b.SetParallelism(8) // 16 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := eng.Check(b.Context(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			var total, busiest float64
			for _, n := range nodes {
				_, usec := commandStat(n.Info(b.Context(), "commandstats").Val(), "evalsha")
				total += usec
				busiest = max(busiest, usec)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(busiest/max(1, total), "busiest-master-share")
		})
	}
}
