package regional

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// 200 goroutines race for a bucket with n units left: exactly n win, for
// every algorithm (a fixed window both counted and scripted), on real
// Redis.
func TestConcurrentRaceForLastTokens(t *testing.T) {
	const racers, left = 200, 37
	h := newHarness(t)
	h.now.Set(1_000_000) // frozen clock: no refill during the race
	for _, l := range raceLimits {
		for _, path := range windowPaths {
			if path.scripted && l.Algorithm != policy.FixedWindow {
				continue
			}
			t.Run(string(l.Algorithm)+"/"+path.name, func(t *testing.T) {
				h.t = t
				h.fresh(path.scripted)
				tenant := "race-" + path.name
				h.check(1_000_000, l, tenant, 100-left) // leave exactly `left`
				if got := race(t, h.eng, l, tenant, racers); got != left {
					t.Fatalf("%d of %d racers admitted, want exactly %d", got, racers, left)
				}
			})
		}
	}
}

// raceLimits are 100 units of every algorithm, none refilling during a race.
var raceLimits = []policy.Limits{
	{Algorithm: policy.TokenBucket, Capacity: 100 * policy.Micro, Rate: policy.Micro},
	{Algorithm: policy.FixedWindow, Capacity: 100 * policy.Micro, WindowMs: 60_000},
	{Algorithm: policy.SlidingWindow, Capacity: 100 * policy.Micro, WindowMs: 60_000},
	{Algorithm: policy.SlidingLog, Capacity: 100 * policy.Micro, WindowMs: 60_000},
}

// race starts racers concurrent checks of cost 1 for tenant under l at
// once and returns how many were admitted.
func race(t *testing.T, eng *Engine, l policy.Limits, tenant string, racers int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range racers {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := eng.Check(ctx, Request{Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": tenant}, Cost: 1, Limits: &l})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return admitted.Load()
}

// The same race with the Redis server clock (no injected time): a bucket
// refilling one unit per hour cannot refill during the race.
func TestConcurrentRaceRedisTime(t *testing.T) {
	const racers, left = 200, 11
	srv := redistest.Start(t)
	eng := newEngine(t, srv.Client(t), testPolicies(t), Config{})
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 50 * policy.Micro, Rate: policy.Micro / 3600}
	req := Request{Policy: "tb", Attributes: map[string]string{"tenant": "race"}, Cost: 50 - left, Limits: &l}
	if d, err := eng.Check(t.Context(), req); err != nil || !d.Allowed {
		t.Fatalf("drain: %+v %v", d, err)
	}
	if got := race(t, eng, l, "race", racers); got != left {
		t.Fatalf("%d admitted, want %d", got, left)
	}
}

func TestIdempotentRetryIsNotChargedTwice(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const window = 300 * time.Millisecond
	eng := newEngine(t, rdb, testPolicies(t), Config{IdempotencyWindow: window})
	req := Request{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 5, IdempotencyKey: "req-1"}
	firstAt := time.Now()
	first, err := eng.Check(t.Context(), req)
	if err != nil || !first.Allowed || first.Remaining != 15*policy.Micro {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := eng.Check(t.Context(), req)
	if err != nil || !again.Replayed || again.Allowed != first.Allowed || again.Remaining != first.Remaining {
		t.Fatalf("retry: %+v %v, want the first decision replayed", again, err)
	}
	// A different key is a different request and is charged.
	req.IdempotencyKey = "req-2"
	if d, _ := eng.Check(t.Context(), req); d.Replayed || d.Remaining > 10*policy.Micro+policy.Micro {
		t.Fatalf("req-2: %+v, want charged (about 10 left)", d)
	}
	// After the window, req-1 is a new request again; not before.
	req.IdempotencyKey = "req-1"
	testenv.WaitFor(t, 10*window, "req-1 decided afresh after the window", func() bool {
		d, err := eng.Check(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return !d.Replayed
	})
	if took := time.Since(firstAt); took < window {
		t.Fatalf("req-1 decided afresh %v after it was first decided, within the window of %v", took, window)
	}
	// Rejections are replayed too, and the key is scoped to the identity.
	other := Request{Policy: "tb", Attributes: map[string]string{"tenant": "b"}, Cost: 5, IdempotencyKey: "req-1"}
	if d, _ := eng.Check(t.Context(), other); d.Replayed {
		t.Fatalf("same idempotency key, other tenant: %+v, want its own decision", d)
	}
}

func TestBatch(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1000)
	attrs := func(s string) map[string]string { return map[string]string{"tenant": s} }
	reqs := []Request{
		{Policy: "tb", Attributes: attrs("a"), Cost: 15},
		{Policy: "tb", Attributes: attrs("a"), Cost: 15}, // same key: decided after the first
		{Policy: "nope", Attributes: attrs("a"), Cost: 1},
		{Policy: "fw", Attributes: attrs("a"), Cost: 10},
		{Policy: "sl", Attributes: attrs("a"), Cost: 0},
		{Policy: "sl", Attributes: attrs("b"), Cost: 3},
	}
	res := h.eng.CheckBatch(t.Context(), reqs)
	if !res[0].Decision.Allowed || res[1].Decision.Allowed || res[1].Decision.Remaining != 5*policy.Micro {
		t.Fatalf("same key in one batch: %+v %+v", res[0], res[1])
	}
	if !errors.Is(res[2].Err, admission.ErrUnknownPolicy) || !errors.Is(res[4].Err, policy.ErrInvalidCost) {
		t.Fatalf("invalid requests: %v / %v", res[2].Err, res[4].Err)
	}
	if !res[3].Decision.Allowed || !res[5].Decision.Allowed || res[5].Err != nil {
		t.Fatalf("valid requests: %+v %+v", res[3], res[5])
	}
}

// A Redis that lost its scripts (restart, SCRIPT FLUSH, failover) is
// handled on both paths: the decision is made once, not skipped or doubled.
func TestNoScriptIsReloaded(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1000)
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: policy.Micro}
	h.check(1000, l, "a", 1)
	h.rdb.ScriptFlush(t.Context())
	if d := h.check(1000, l, "a", 1); d.Remaining != 8*policy.Micro {
		t.Fatalf("single after flush: %+v", d)
	}
	h.rdb.ScriptFlush(t.Context())
	res := h.eng.CheckBatch(t.Context(), []Request{
		{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1, Limits: &l},
		{Policy: "fw", Attributes: map[string]string{"tenant": "a"}, Cost: 1},
	})
	if res[0].Err != nil || res[0].Decision.Remaining != 7*policy.Micro || res[1].Err != nil || !res[1].Decision.Allowed {
		t.Fatalf("batch after flush: %+v", res)
	}
}

// Bad input gets a clear error and writes nothing.
func TestBadInputWritesNothing(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1000)
	a := map[string]string{"tenant": "acme"}
	tiny := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 0, Rate: policy.Micro}
	wrongAlg := policy.Limits{Algorithm: policy.FixedWindow, Capacity: policy.Micro, WindowMs: 10}
	cases := []struct {
		req  Request
		want error
		text string
	}{
		{Request{Policy: "tb", Attributes: a, Cost: 0}, policy.ErrInvalidCost, "positive"},
		{Request{Policy: "tb", Attributes: a, Cost: -3}, policy.ErrInvalidCost, "-3"},
		{Request{Policy: "tb", Attributes: a, Cost: 21}, policy.ErrCostExceedsCapacity, "never be admitted"},
		{Request{Policy: "tb", Attributes: a, Cost: 1 << 62}, policy.ErrCostExceedsCapacity, "capacity 20"},
		{Request{Policy: "missing", Attributes: a, Cost: 1}, admission.ErrUnknownPolicy, `"missing"`},
		{Request{Policy: "tb", Attributes: map[string]string{"user": "x"}, Cost: 1}, policy.ErrInvalidIdentity, `needs attribute "tenant"`},
		{Request{Policy: "tb", Attributes: map[string]string{"tenant": ""}, Cost: 1}, policy.ErrInvalidIdentity, "empty"},
		{Request{Policy: "tb", Attributes: map[string]string{"tenant": strings.Repeat("x", 300)}, Cost: 1}, policy.ErrInvalidIdentity, "more than 256"},
		{Request{Policy: "tb", Attributes: a, Cost: 1, IdempotencyKey: strings.Repeat("k", 129)}, admission.ErrInvalidRequest, "idempotency"},
		{Request{Policy: "tb", Attributes: a, Cost: 1, IdempotencyKey: "has space"}, admission.ErrInvalidRequest, "printable"},
		{Request{Policy: "tb", Attributes: a, Cost: 1, Limits: &tiny}, policy.ErrInvalidLimits, "capacity"},
		{Request{Policy: "tb", Attributes: a, Cost: 1, Limits: &wrongAlg}, admission.ErrInvalidRequest, "fixed_window"},
	}
	for i, c := range cases {
		_, err := h.eng.Check(t.Context(), c.req)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("case %d: error %v, want %v mentioning %q", i, err, c.want, c.text)
		}
	}
	res := h.eng.CheckBatch(t.Context(), []Request{cases[0].req, cases[4].req})
	if res[0].Err == nil || res[1].Err == nil {
		t.Errorf("batch accepted bad input: %+v", res)
	}
	if n := h.dbsize(); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
}

// A decision that fails inside a batch's script call (here a key of the
// wrong type, left by something else) fails alone: the decisions before
// and after it in the same call are made and answered, including a second
// one on a key the first charged.
func TestBatchDecisionFailsAlone(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1000)
	attrs := func(s string) map[string]string { return map[string]string{"tenant": s} }
	if err := h.rdb.Set(t.Context(), h.key(policy.TokenBucket, "squatted"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	res := h.eng.CheckBatch(t.Context(), []Request{
		{Policy: "tb", Attributes: attrs("a"), Cost: 15},
		{Policy: "tb", Attributes: attrs("squatted"), Cost: 1},
		{Policy: "tb", Attributes: attrs("a"), Cost: 15},
		{Policy: "sl", Attributes: attrs("a"), Cost: 4},
	})
	if res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "WRONGTYPE") || !strings.Contains(res[1].Err.Error(), `policy "tb"`) {
		t.Fatalf("decision on a key of the wrong type: %+v, want its WRONGTYPE error", res[1])
	}
	if res[0].Err != nil || !res[0].Decision.Allowed || res[2].Err != nil || res[2].Decision.Allowed || res[2].Decision.Remaining != 5*policy.Micro {
		t.Fatalf("decisions around the failed one: %+v %+v", res[0], res[2])
	}
	if res[3].Err != nil || !res[3].Decision.Allowed || res[3].Decision.Remaining != 6*policy.Micro {
		t.Fatalf("decision after the failed one: %+v", res[3])
	}
}

// A decision script call whose keys or arguments do not add up is refused
// whole before it decides anything.
func TestMalformedScriptCallChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1000)
	tk, err := h.eng.ticket(Request{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	d, err := h.eng.prepare(tk)
	if err != nil {
		t.Fatal(err)
	}
	good := append([]any{"1000", 0, 600_000}, d.args[:]...)
	unknown := append([]any{"1000", 0, 600_000}, d.args[:]...)
	unknown[3] = "bucket"
	if err := decideScript.Run(t.Context(), h.rdb, d.keys, good...).Err(); err != nil {
		t.Fatalf("the well-formed call: %v", err) // so that the others fail for their fault
	}
	h.rdb.FlushAll(t.Context())
	for name, c := range map[string]scriptCall{
		"a key missing":       {keys: d.keys[:1], args: good},
		"a key too many":      {keys: append(d.keys, d.keys...), args: good},
		"an argument missing": {keys: d.keys, args: good[:len(good)-1]},
		"no floor":            {keys: d.keys, args: append([]any{"1000", 600_000}, d.args[:]...)},
		"no reservation TTL":  {keys: d.keys, args: append([]any{"1000", 0, 0}, d.args[:]...)},
		"no decision":         {keys: nil, args: good[:3]},
		"unknown algorithm":   {keys: d.keys, args: unknown},
	} {
		err := decideScript.Run(t.Context(), h.rdb, c.keys, c.args...).Err()
		if err == nil || !strings.Contains(err.Error(), "ERR") {
			t.Errorf("%s: error %v, want the call refused", name, err)
		}
	}
	if n := h.dbsize(); n != 0 {
		t.Fatalf("refused calls wrote %d keys", n)
	}
}

// Keys expire once they would be idle anyway: TTL = time to refill an
// empty bucket (or the window span) plus the margin; a fixed window's
// counter once its window has ended, plus the margin, by either path.
func TestKeyTTL(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		l    policy.Limits
		want time.Duration
	}{
		{policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}, 4*time.Second + time.Second},
		{policy.Limits{Algorithm: policy.FixedWindow, Capacity: 20 * policy.Micro, WindowMs: 3000}, time.Second + time.Second}, // [3 s, 6 s) at 5 s
		{policy.Limits{Algorithm: policy.SlidingWindow, Capacity: 20 * policy.Micro, WindowMs: 3000}, 6*time.Second + time.Second},
		{policy.Limits{Algorithm: policy.SlidingLog, Capacity: 20 * policy.Micro, WindowMs: 3000}, 3*time.Second + time.Second},
	}
	for _, path := range windowPaths {
		h.fresh(path.scripted)
		for _, c := range cases {
			tenant := "ttl-" + path.name
			h.check(5000, c.l, tenant, 1)
			key := h.key(c.l.Algorithm, tenant)
			if c.l.Algorithm == policy.FixedWindow {
				key = counterKey(key, 5000/c.l.WindowMs)
			}
			ttl := h.rdb.PTTL(t.Context(), key).Val()
			if ttl <= c.want-200*time.Millisecond || ttl > c.want {
				t.Errorf("%s (%s): TTL %v, want about %v", c.l.Algorithm, path.name, ttl, c.want)
			}
		}
	}
}

func TestRedisTimeIsUsedByDefault(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	eng := newEngine(t, rdb, testPolicies(t), Config{})
	if _, err := eng.Check(t.Context(), Request{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	tm, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := eng.Policy("tb")
	id, _ := p.IdentityOf(map[string]string{"tenant": "a"})
	key, _ := StateKey(p, id)
	last, _ := rdb.HGet(t.Context(), key, "l").Int64()
	if d := tm.UnixMilli() - last; d < 0 || d > 5000 {
		t.Fatalf("stored time %d is %d ms from the Redis clock %d", last, d, tm.UnixMilli())
	}
}

func TestRedisDownIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	eng := newEngine(t, srv.Client(t), testPolicies(t), Config{})
	srv.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := eng.Check(ctx, Request{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1})
	if err == nil || !strings.Contains(err.Error(), `check policy "tb"`) {
		t.Fatalf("error %v, want a wrapped connection error", err)
	}
	res := eng.CheckBatch(ctx, []Request{{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1}})
	if res[0].Err == nil {
		t.Fatal("batch against a dead Redis reported no error")
	}
}

func TestSetPoliciesKeepsOldSetOnError(t *testing.T) {
	h := newHarness(t)
	bad := &policy.Policy{Name: "x"}
	if err := h.eng.SetPolicies([]*policy.Policy{bad}); err == nil {
		t.Fatal("invalid policy accepted")
	}
	if _, ok := h.eng.Policy("tb"); !ok {
		t.Fatal("failed SetPolicies dropped the old set")
	}
}

func ExampleEngine_Check() {
	// A real program passes a *redis.Client; see cmd/regional-agent.
	fmt.Println(policy.Decision{Allowed: true, Remaining: 19 * policy.Micro}.RemainingUnits())
	// Output: 19
}
