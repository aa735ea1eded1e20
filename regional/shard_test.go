package regional

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// A policy with shards splits an identity's limits into parts, each on a
// key in a slot of its own, decided in turn. 200 racers for an identity
// with a burst of 22 split in 4 (parts of 5.5, so 5 whole units each) get
// exactly 20: never more than one key's 22. A keyed retry goes to the part
// that decided it and is replayed; a cost no part can hold is refused.
func TestShardsSplitAnIdentity(t *testing.T) {
	ps := testenv.MustPolicies(t, "name: hot\nidentity: [tenant]\nlimit: 1\nperiod: 1s\nburst: 22\nshards: 4\n")
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	var now clock.Manual
	now.Set(1_000_000) // frozen: no refill during the race
	eng := newEngine(t, rdb, ps, Config{Clock: &now, Pipelines: 2})
	defer eng.Close()
	ctx := context.Background()
	attrs := map[string]string{"tenant": "abuser"}

	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := eng.Check(ctx, Request{Policy: "hot", Attributes: attrs, Cost: 1})
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 20 {
		t.Fatalf("%d of 200 racers admitted, want exactly 4 parts x 5", got)
	}

	p := ps[0]
	id, _ := p.IdentityOf(attrs)
	slots := map[int]bool{}
	for k := range int64(4) {
		key, err := ShardKey(p, id, k)
		if err != nil {
			t.Fatal(err)
		}
		if tokens, _ := rdb.HGet(ctx, key, "t").Int64(); tokens != 500_000 {
			t.Errorf("shard %d (%s) holds %d micro-units, want the 0.5 its part cannot use", k, key, tokens)
		}
		slots[KeySlot(key)] = true
	}
	if len(slots) != 4 {
		t.Errorf("the 4 shards live in %d hash slots, want 4", len(slots))
	}

	keyed := Request{Policy: "hot", Attributes: map[string]string{"tenant": "retrier"}, Cost: 3, IdempotencyKey: "req-1"}
	first, err1 := eng.Check(ctx, keyed)
	again, err2 := eng.Check(ctx, keyed)
	if err := errors.Join(err1, err2); err != nil || !first.Allowed || !again.Replayed || again.Remaining != first.Remaining {
		t.Fatalf("keyed retry: %+v then %+v (%v), want the first decision replayed", first, again, err)
	}

	_, err := eng.Check(ctx, Request{Policy: "hot", Attributes: attrs, Cost: 6})
	if !errors.Is(err, policy.ErrCostExceedsCapacity) || !strings.Contains(err.Error(), "one of 4 shards") {
		t.Fatalf("cost 6 against parts of 5.5: %v, want ErrCostExceedsCapacity naming the shards", err)
	}
}
