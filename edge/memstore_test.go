package edge

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// The store in memory (the simulator's) keeps the reservations as the
// agent's script does in Redis: random updates from three agents (growth,
// shrinking, demands only, another's capacity, instance places, an agent
// succeeding the one before it) go through both, MemStore and
// internal/agent/lua/edge_sync.lua on a real redis-server, and every grant
// and every sum of the others must match.
func TestMemStoreAsTheScript(t *testing.T) {
	lua, err := os.ReadFile("../internal/agent/lua/edge_sync.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(string(lua))
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	m := NewMemStore(func() int64 { return 0 })
	id := func(i int) ID { return ID{Policy: "api", Identity: strconv.Itoa(i)} }
	rng := rand.New(rand.NewPCG(7, 8))
	const ids, capacity = 3, 1000
	for step := 0; step < 400; step++ {
		gen := rng.IntN(3)
		x := m.Agent(strconv.Itoa(gen), strconv.Itoa(gen-1))
		var ws []Write
		var args []any
		for i := 0; i < ids; i++ {
			if rng.IntN(3) == 0 {
				continue
			}
			u := Update{Want: rng.Int64N(capacity), Capacity: capacity - rng.Int64N(200), Instances: rng.Int64N(6), Most: 4,
				Largest: rng.Int64N(300), Life: time.Hour}
			if rng.IntN(4) == 0 {
				u.Want = 0
			}
			if rng.IntN(2) == 0 {
				u.EdgeDemand, u.Direct = rng.Int64N(500), rng.Int64N(500)
			}
			ws = append(ws, Write{ID: id(i), Update: u})
			args = append(args, strconv.Itoa(i), u.Want, u.Capacity, u.EdgeDemand, u.Direct, u.Life.Milliseconds(), u.Instances, u.Most, u.Largest)
		}
		granted, others, err := x.Sync(ctx, ws, true)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "full", "0", 1000, "") // read the whole hash: three fields are one page
		keys := []string{"ql:edge:{us}", "ql:edgelog:{us}", "ql:edgeseq:{us}"}
		got, err := script.Run(ctx, rdb, keys, append([]any{strconv.Itoa(gen), strconv.Itoa(gen - 1), len(ws)}, args...)...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if got[3] != "0" {
			t.Fatalf("step %d: the read did not end in one page (cursor %v)", step, got[3])
		}
		// What moved from the agent before is compared but for its time
		// left: the model's clock is not Redis's.
		var flat []int64
		gs := got[1].([]any)
		for i, g := range granted {
			in := g.Inherited
			flat = append(flat, g.Reserved, g.Places, in.Reserved, in.Largest, in.Places, in.Edge, in.Direct)
			gs = append(gs[:7*i+5], gs[7*i+6:]...)
		}
		if want := fmt.Sprint(gs); fmt.Sprint(strs(flat)) != want {
			t.Fatalf("step %d, agent %d: the model granted %v, the script %v", step, gen, granted, want)
		}
		if sums := scriptSums(t, got[2].([]any), strconv.Itoa(gen)); !maps.Equal(sums, others) {
			t.Fatalf("step %d: the model sums %v, the script %v", step, others, sums)
		}
		// Every agent's reservation and places, as stored.
		stored := map[[2]int][3]int64{}
		for f, v := range rdb.HGetAll(ctx, "ql:edge:{us}").Val() {
			i, _ := strconv.Atoi(f)
			for _, line := range strings.Split(v, "\n") {
				var gen int
				var r, e, d, exp, places, largest int64
				if _, err := fmt.Sscan(line, &gen, &r, &e, &d, &exp, &places, &largest); err != nil {
					t.Fatalf("entry %q: %v", line, err)
				}
				stored[[2]int{i, gen}] = [3]int64{r, places, largest}
			}
		}
		model := map[[2]int][3]int64{}
		for k, es := range m.res {
			i, _ := strconv.Atoi(k.Identity)
			for who, en := range es {
				g, _ := strconv.Atoi(who)
				model[[2]int{i, g}] = [3]int64{en.reserved, en.places, en.largest}
			}
		}
		if !maps.Equal(stored, model) {
			t.Fatalf("step %d: the model holds %v, the script %v (identity and agent: reserved, places, largest)", step, model, stored)
		}
	}
}

// scriptSums sums, by identity, the entries of agents other than me in
// the fields a whole read returned (their expiry is an hour away).
func scriptSums(t *testing.T, fields []any, me string) map[ID]Others {
	t.Helper()
	out := map[ID]Others{}
	for i := 0; i < len(fields); i += 2 {
		id := ID{Policy: "api", Identity: fields[i].(string)}
		var o Others
		for _, line := range strings.Split(fields[i+1].(string), "\n") {
			var who string
			var r, e, d int64
			if _, err := fmt.Sscan(line, &who, &r, &e, &d); err != nil {
				t.Fatalf("entry %q: %v", line, err)
			}
			if who != me {
				o.Reserved, o.Edge, o.Direct = o.Reserved+r, o.Edge+e, o.Direct+d
			}
		}
		if o != (Others{}) {
			out[id] = o
		}
	}
	return out
}

// strs is v as the script answers numbers.
func strs(v []int64) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = strconv.FormatInt(x, 10)
	}
	return out
}
