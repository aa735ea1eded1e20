package regional

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// testPolicies are one policy per algorithm; tests override their limits
// per request where they need other numbers.
func testPolicies(t testing.TB) []*policy.Policy {
	t.Helper()
	ps := testenv.MustPolicies(t, `
name: tb
identity: [tenant]
limit: 5
period: 1s
burst: 20
---
name: fw
identity: [tenant]
algorithm: fixed_window
limit: 10
period: 1s
---
name: sw
identity: [tenant]
algorithm: sliding_window
limit: 10
period: 1s
---
name: sl
identity: [tenant]
algorithm: sliding_log
limit: 10
period: 1s
`)
	return ps
}

var algPolicy = map[policy.Algorithm]string{policy.TokenBucket: "tb", policy.FixedWindow: "fw", policy.SlidingWindow: "sw", policy.SlidingLog: "sl"}

// harness is an engine on a real Redis with a clock the test moves.
type harness struct {
	t   testing.TB
	rdb *redis.Client
	eng *Engine
	now clock.Manual
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	srv := redistest.Start(t)
	h := &harness{t: t, rdb: srv.Client(t)}
	h.fresh(false)
	return h
}

// fresh gives h a new engine, on the same Redis and clock: its fixed
// windows start with no floor, as a key's state starts with no time, so
// that a case on a new key does not inherit the times of cases before it.
// scripted sends every fixed-window decision to the script.
func (h *harness) fresh(scripted bool) {
	h.t.Helper()
	h.eng = newEngine(h.t, h.rdb, testPolicies(h.t), Config{Clock: &h.now})
	h.eng.scriptedWindows = scripted
}

// windowPaths are the two ways a fixed window is decided, for the tests
// that run every algorithm through both.
var windowPaths = []struct {
	name     string
	scripted bool
}{{"counted", false}, {"scripted", true}}

// check runs one request at time nowMs with the given limits.
func (h *harness) check(nowMs int64, l policy.Limits, tenant string, cost int64) policy.Decision {
	h.t.Helper()
	h.now.Set(nowMs)
	d, err := h.eng.Check(context.Background(), Request{
		Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": tenant},
		Cost: cost, Check: cost == 0, Limits: &l,
	})
	if err != nil {
		h.t.Fatalf("check at %d: %v", nowMs, err)
	}
	return d
}

func (h *harness) key(alg policy.Algorithm, tenant string) string {
	p, _ := h.eng.Policy(algPolicy[alg])
	id, _ := p.IdentityOf(map[string]string{"tenant": tenant})
	k, _ := StateKey(p, id)
	return k
}

// state reads a key's state from Redis into a State, for comparison with
// the pure transition.
func (h *harness) state(alg policy.Algorithm, tenant string) policy.State {
	h.t.Helper()
	ctx := context.Background()
	key := h.key(alg, tenant)
	num := func(m map[string]string, f string) int64 {
		v, err := strconv.ParseInt(m[f], 10, 64)
		if err != nil {
			h.t.Fatalf("key %s field %s = %q: %v", key, f, m[f], err)
		}
		return v
	}
	if alg == policy.SlidingLog {
		m := h.rdb.HGetAll(ctx, key+":m").Val()
		if len(m) == 0 {
			return policy.State{}
		}
		s := policy.State{Exists: true, LastMs: num(m, "l"), Sum: num(m, "s")}
		zs := h.rdb.ZRangeWithScores(ctx, key, 0, -1).Val()
		sort.SliceStable(zs, func(i, j int) bool { return zs[i].Score < zs[j].Score })
		for _, z := range zs {
			parts := strings.Split(z.Member.(string), ":")
			c, _ := strconv.ParseInt(parts[2], 10, 64)
			s.Log = append(s.Log, policy.LogEntry{AtMs: int64(z.Score), Cost: c})
		}
		return s
	}
	if alg == policy.FixedWindow {
		return h.windowState(key)
	}
	m := h.rdb.HGetAll(ctx, key).Val()
	if len(m) == 0 {
		return policy.State{}
	}
	s := policy.State{Exists: true, LastMs: num(m, "l")}
	switch alg {
	case policy.TokenBucket:
		s.Tokens = num(m, "t")
	case policy.FixedWindow:
		s.Window, s.Count = num(m, "w"), num(m, "c")
	case policy.SlidingWindow:
		s.Window, s.Prev, s.Count = num(m, "w"), num(m, "p"), num(m, "c")
	}
	return s
}

// windowState reads the fixed-window counters of state key key as a
// State: the latest window with a counter and its count, at the engine's
// floor (the counters keep no time of their own).
func (h *harness) windowState(key string) policy.State {
	h.t.Helper()
	ctx := context.Background()
	counters, err := h.rdb.Keys(ctx, key+":w*").Result()
	if err != nil {
		h.t.Fatal(err)
	}
	s := policy.State{Window: -1}
	for _, c := range counters {
		w, err := strconv.ParseInt(strings.TrimPrefix(c, key+":w"), 10, 64)
		if err != nil {
			h.t.Fatalf("counter %s: %v", c, err)
		}
		if w > s.Window {
			s.Window = w
			if s.Count, err = h.rdb.Get(ctx, c).Int64(); err != nil {
				h.t.Fatalf("counter %s: %v", c, err)
			}
		}
	}
	if s.Window < 0 {
		return policy.State{}
	}
	s.Exists, s.LastMs = true, h.eng.clk.floor()
	return s
}

// dbsize counts the keys in Redis besides the store's birth marker.
func (h *harness) dbsize() int64 {
	n := h.rdb.DBSize(context.Background()).Val()
	if h.rdb.Exists(context.Background(), BornKey).Val() == 1 {
		n--
	}
	return n
}

// equalState compares states ignoring the order of same-time log entries.
func equalState(a, b policy.State) bool {
	if a.Exists != b.Exists || a.LastMs != b.LastMs || a.Tokens != b.Tokens || a.Window != b.Window ||
		a.Count != b.Count || a.Prev != b.Prev || a.Sum != b.Sum || len(a.Log) != len(b.Log) {
		return false
	}
	key := func(l []policy.LogEntry) []string {
		out := make([]string, len(l))
		for i, e := range l {
			out[i] = strconv.FormatInt(e.AtMs, 10) + "/" + strconv.FormatInt(e.Cost, 10)
		}
		sort.Strings(out)
		return out
	}
	ka, kb := key(a.Log), key(b.Log)
	for i := range ka {
		if ka[i] != kb[i] {
			return false
		}
	}
	return true
}

// newEngine returns an engine on rdb with the settings of cfg that are
// set, the others at their defaults, whose store is marked new, as the
// agent does at start (InitStore), so fresh keys start full.
func newEngine(tb testing.TB, rdb Client, ps []*policy.Policy, cfg Config) *Engine {
	tb.Helper()
	c := DefaultConfig()
	c.Clock, c.Pipelines = cfg.Clock, cfg.Pipelines
	if cfg.IdempotencyWindow != 0 {
		c.IdempotencyWindow = cfg.IdempotencyWindow
	}
	eng, err := NewEngine(rdb, ps, c)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := eng.InitStore(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return eng
}
