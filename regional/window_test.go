package regional

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// settleWindow's arithmetic, case by case: a charge within the capacity
// admitted, one beyond rejected without counting itself or the call's
// earlier rejections, a charge read outside its window decided again, a
// store that lost its memory admitting nothing in the window of the loss;
// a charge after the fact (postHoc) counted over the limit, and checks
// (cost 0) admitted while the window is within its limit.
func TestSettleWindow(t *testing.T) {
	const m = policy.Micro
	var (
		kept   = windowSettled{}
		refund = windowSettled{refund: true}
		missed = windowSettled{missed: true, refund: true}
		lost   = windowSettled{refund: true, lost: true}
	)
	cases := []struct {
		name                 string
		cost, t1, t2, n, pen int64
		born                 int64
		hasBorn, postHoc     bool
		want                 policy.Decision
		settled              windowSettled
	}{
		{"admitted", 3 * m, 5100, 5101, 7 * m, 0, 0, true, false, policy.Decision{Allowed: true, Remaining: 3 * m, ResetAfterMs: 900}, kept},
		{"the last that fits", 3 * m, 5100, 5100, 10 * m, 0, 0, true, false, policy.Decision{Allowed: true, ResetAfterMs: 900}, kept},
		{"over: its own charge not counted", 3 * m, 5100, 5100, 11 * m, 0, 0, true, false, policy.Decision{Remaining: 2 * m, RetryAfterMs: 900, ResetAfterMs: 900}, refund},
		{"an earlier rejection of the call not counted", 2 * m, 5100, 5100, 13 * m, 3 * m, 0, true, false, policy.Decision{Allowed: true, ResetAfterMs: 900}, kept},
		{"more than the capacity charged before a lowered limit", m, 5100, 5100, 13 * m, 0, 0, true, false, policy.Decision{Debt: 2 * m, RetryAfterMs: 900, ResetAfterMs: 900}, refund},
		{"read before its window", m, 4999, 5001, m, 0, 0, true, false, policy.Decision{}, missed},
		{"read after its window", m, 5998, 6000, m, 0, 0, true, false, policy.Decision{}, missed},
		{"marker missing: the loss is now", m, 5100, 5100, m, 0, 0, false, false, policy.Decision{RetryAfterMs: 900, ResetAfterMs: 900}, lost},
		{"born in this window", m, 5100, 5100, m, 0, 5050, true, false, policy.Decision{RetryAfterMs: 900, ResetAfterMs: 900}, refund},
		{"born after now: from the birth", m, 5100, 5100, m, 0, 5300, true, false, policy.Decision{RetryAfterMs: 700, ResetAfterMs: 700}, refund},
		{"born in the window before", m, 5100, 5100, m, 0, 4999, true, false, policy.Decision{Allowed: true, Remaining: 9 * m, ResetAfterMs: 900}, kept},
		{"a new store", m, 5100, 5100, m, 0, 0, true, false, policy.Decision{Allowed: true, Remaining: 9 * m, ResetAfterMs: 900}, kept},
		{"after the fact: over, counted", 3 * m, 5100, 5100, 11 * m, 0, 0, true, true, policy.Decision{Debt: m, RetryAfterMs: 900, ResetAfterMs: 900}, kept},
		{"after the fact: larger than the limit, counted", 15 * m, 5100, 5100, 15 * m, 0, 0, true, true, policy.Decision{Debt: 5 * m, RetryAfterMs: 900, ResetAfterMs: 900}, kept},
		{"after the fact in the window of a loss: counted", m, 5100, 5100, m, 0, 5050, true, true, policy.Decision{Debt: m, RetryAfterMs: 900, ResetAfterMs: 900}, kept},
		{"after the fact, marker missing", m, 5100, 5100, m, 0, 0, false, true, policy.Decision{Debt: m, RetryAfterMs: 900, ResetAfterMs: 900}, windowSettled{lost: true}},
		{"a check at the limit", 0, 5100, 5100, 10 * m, 0, 0, true, true, policy.Decision{Allowed: true, ResetAfterMs: 900}, kept},
		{"a check over the limit", 0, 5100, 5100, 11 * m, 0, 0, true, true, policy.Decision{Debt: m, RetryAfterMs: 900, ResetAfterMs: 900}, kept},
		{"a check in the window of a loss, nothing charged since", 0, 5100, 5100, 0, 0, 5050, true, false, policy.Decision{Allowed: true, ResetAfterMs: 900}, kept},
	}
	for _, c := range cases {
		got, s := settleWindow(10*m, 1000, c.cost, 5, c.t1, c.t2, c.n, c.pen, c.born, c.hasBorn, c.postHoc)
		if got != c.want || s != c.settled {
			t.Errorf("%s: %+v %+v, want %+v %+v", c.name, got, s, c.want, c.settled)
		}
	}
}

// serverClockEngine is an engine deciding on the Redis server clock, as in
// production, whose counters outlive the test.
func serverClockEngine(t *testing.T) (*redis.Client, *Engine) {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	cfg := DefaultConfig()
	cfg.TTLMargin = time.Minute
	eng, err := NewEngine(rdb, testPolicies(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.InitStore(t.Context()); err != nil {
		t.Fatal(err)
	}
	return rdb, eng
}

// inOneWindow runs f and reports whether the server clock stayed in one
// window of w ms meanwhile, so that a test counting per window can try
// again rather than fail when a boundary happens to fall within it.
func inOneWindow(t *testing.T, rdb redis.Cmdable, w int64, f func()) bool {
	t.Helper()
	before, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	f()
	after, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return before.UnixMilli()/w == after.UnixMilli()/w
}

// counters returns the fixed-window counters of tenant under policy fw, by
// window index.
func counters(t *testing.T, rdb *redis.Client, eng *Engine, tenant string) map[string]int64 {
	t.Helper()
	p, _ := eng.Policy("fw")
	id, _ := p.IdentityOf(map[string]string{"tenant": tenant})
	key, _ := StateKey(p, id)
	keys, err := rdb.Keys(t.Context(), key+":w*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, k := range keys {
		if out[strings.TrimPrefix(k, key+":")], err = rdb.Get(t.Context(), k).Int64(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// On the server clock a rejection is not charged: after one, a request
// that fits what is left is admitted, and the counter holds exactly what
// was admitted.
func TestWindowRejectionIsRefunded(t *testing.T) {
	rdb, eng := serverClockEngine(t)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 24 * 3_600_000}
	for try := 0; ; try++ {
		tenant := fmt.Sprint("refund-", try)
		check := func(cost int64) policy.Decision {
			d, err := eng.Check(t.Context(), Request{Policy: "fw", Attributes: map[string]string{"tenant": tenant}, Cost: cost, Limits: &l})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		var got [3]policy.Decision
		if !inOneWindow(t, rdb, l.WindowMs, func() { got = [3]policy.Decision{check(7), check(5), check(3)} }) && try < 2 {
			continue
		}
		if !got[0].Allowed || got[1].Allowed || got[1].Remaining != 3*policy.Micro || !got[2].Allowed || got[2].Remaining != 0 {
			t.Fatalf("7, 5, 3 of 10: %+v, want admitted, rejected with 3 left, admitted with none", got)
		}
		c := counters(t, rdb, eng, tenant)
		if len(c) != 1 {
			t.Fatalf("counters %v, want one", c)
		}
		for _, v := range c {
			if v != 10*policy.Micro {
				t.Fatalf("counter %d, want exactly the 10 admitted: the rejection's charge was not taken back", v)
			}
		}
		return
	}
}

// The engine's estimate of the server clock only picks the counter to
// charge. Wrong by an hour either way, 60 racers for 20 still get exactly
// 20 (each charge made in the wrong window is taken back and the script
// decides it on the server clock), all of them in the counter of the
// server's window and none in another, and the replies correct the
// estimate.
func TestWindowEstimateOffStaysExact(t *testing.T) {
	for _, off := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(off.String(), func(t *testing.T) {
			rdb, eng := serverClockEngine(t)
			l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 20 * policy.Micro, WindowMs: 10 * 60_000}
			for try := 0; ; try++ {
				tenant := fmt.Sprint("off-", try)
				rdb.ConfigResetStat(t.Context())
				server, err := rdb.Time(t.Context()).Result()
				if err != nil {
					t.Fatal(err)
				}
				eng.clk.offsetUs.Store(server.Add(off).UnixMicro() - time.Since(eng.clk.base).Microseconds())
				var admitted atomic.Int64
				if !inOneWindow(t, rdb, l.WindowMs, func() { admitted.Store(race(t, eng, l, tenant, 60)) }) && try < 2 {
					continue
				}
				if got := admitted.Load(); got != 20 {
					t.Fatalf("%d of 60 racers admitted, want exactly 20", got)
				}
				now, _ := rdb.Time(t.Context()).Result()
				right := fmt.Sprint("w", now.UnixMilli()/l.WindowMs)
				for w, v := range counters(t, rdb, eng, tenant) {
					if want := map[bool]int64{true: 20 * policy.Micro}[w == right]; v != want {
						t.Fatalf("counter %s holds %d, want %d (the server's window is %s)", w, v, want, right)
					}
				}
				if calls, _ := commandStat(rdb.Info(t.Context(), "commandstats").Val(), "evalsha"); calls == 0 {
					t.Fatal("no decision went to the script: the estimate was never wrong")
				}
				if d := eng.clk.estimate() - now.UnixMilli(); d < -1000 || d > 1000 {
					t.Fatalf("the estimate is %d ms off after the replies", d)
				}
				return
			}
		})
	}
}

// Checks across many window boundaries on the server clock, from four
// callers: no window's counter holds more than the capacity, and all of
// them together hold exactly what was admitted (no charge of a rejection,
// or of a decision sent for the wrong window, is left). The callers check
// until the server clock has crossed four windows (at most 5,000 checks
// each, and 5 s): a fast machine finished a fixed number of checks within
// two.
func TestWindowBoundariesOnServerClock(t *testing.T) {
	rdb, eng := serverClockEngine(t)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 3 * policy.Micro, WindowMs: 20}
	start, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { // the server clock's watch: done after four windows
		deadline := time.Now().Add(5 * time.Second)
		for !done.Load() && time.Now().Before(deadline) {
			now, err := rdb.Time(t.Context()).Result()
			if err == nil && now.Sub(start) >= 4*time.Duration(l.WindowMs)*time.Millisecond {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		done.Store(true)
	})
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 5000 && !done.Load(); i++ {
				d, err := eng.Check(t.Context(), Request{Policy: "fw", Attributes: map[string]string{"tenant": "edges"}, Cost: 1, Limits: &l})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	var sum int64
	c := counters(t, rdb, eng, "edges")
	for w, v := range c {
		if v > l.Capacity {
			t.Fatalf("window %s admitted %d, more than its capacity %d", w, v, l.Capacity)
		}
		sum += v
	}
	if sum != admitted.Load()*policy.Micro || len(c) < 3 {
		t.Fatalf("%d windows hold %d in all, want the %d admitted, over at least 3 windows", len(c), sum, admitted.Load())
	}
}

// A store that loses its memory mid-window (FLUSHALL: the birth marker
// goes with the counters) admits nothing more in the window of the loss on
// the counted path, records the loss in the marker, and admits again once
// that window has passed, on the server clock.
func TestWindowLostStoreOnServerClock(t *testing.T) {
	rdb, eng := serverClockEngine(t)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 5 * policy.Micro, WindowMs: 400}
	check := func() policy.Decision {
		d, err := eng.Check(t.Context(), Request{Policy: "fw", Attributes: map[string]string{"tenant": "lost"}, Cost: 1, Limits: &l})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := check(); !d.Allowed {
		t.Fatalf("before the loss: %+v", d)
	}
	if err := rdb.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	before, _ := rdb.Time(t.Context()).Result()
	if d := check(); d.Allowed || d.RetryAfterMs > l.WindowMs || d.RetryAfterMs < 1 {
		t.Fatalf("right after the loss: %+v, want rejected until the window ends", d)
	}
	after, _ := rdb.Time(t.Context()).Result()
	born, err := rdb.Get(t.Context(), BornKey).Int64()
	if err != nil || born < before.UnixMilli() || born > after.UnixMilli() {
		t.Fatalf("marker %d %v, want the moment of the loss in [%d, %d]", born, err, before.UnixMilli(), after.UnixMilli())
	}
	for w, v := range counters(t, rdb, eng, "lost") {
		if v != 0 {
			t.Fatalf("counter %s holds %d after a rejection in the window of the loss", w, v)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "an admission after the window of the loss", func() bool { return check().Allowed })
	if now, _ := rdb.Time(t.Context()).Result(); now.UnixMilli() < (born/l.WindowMs+1)*l.WindowMs {
		t.Fatalf("admitted at %d, within the window of the loss at %d", now.UnixMilli(), born)
	}
}

// A batch mixing counted decisions with scripted ones (an idempotency
// key) on one key decides them in order, each seeing what those before it
// charged, and the retry in it is replayed: on a Redis that knows the
// script, and on one that does not (the script calls come back NOSCRIPT
// after the charges behind them were made: those are taken back and
// decided again in order).
func TestWindowMixedBatchInOrder(t *testing.T) {
	h := newHarness(t)
	h.now.Set(10_000)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 1000}
	for _, known := range []bool{false, true} {
		tenant := fmt.Sprint("mixed-", known)
		req := func(cost int64, idem string) Request {
			return Request{Policy: "fw", Attributes: map[string]string{"tenant": tenant}, Cost: cost, Limits: &l, IdempotencyKey: idem}
		}
		if known {
			if err := h.eng.LoadScripts(t.Context()); err != nil {
				t.Fatal(err)
			}
		} else {
			h.rdb.ScriptFlush(t.Context())
		}
		res := h.eng.CheckBatch(t.Context(), []Request{req(4, ""), req(4, "k"), req(4, ""), req(4, "k"), req(2, "")})
		want := []policy.Decision{
			{Allowed: true, Remaining: 6 * policy.Micro, ResetAfterMs: 1000},
			{Allowed: true, Remaining: 2 * policy.Micro, ResetAfterMs: 1000},
			{Remaining: 2 * policy.Micro, RetryAfterMs: 1000, ResetAfterMs: 1000},
			{Allowed: true, Remaining: 2 * policy.Micro, ResetAfterMs: 1000, Replayed: true},
			{Allowed: true, ResetAfterMs: 1000},
		}
		for i, r := range res {
			if r.Err != nil || r.Decision != want[i] {
				t.Fatalf("script known %v, decision %d: %+v %v, want %+v", known, i, r.Decision, r.Err, want[i])
			}
		}
		if s := h.state(policy.FixedWindow, tenant); s.Count != 10*policy.Micro {
			t.Fatalf("script known %v: counter %d, want the 10 admitted", known, s.Count)
		}
	}
}

// A scripted decision after a rejected counted one on the same key, in one
// batch, does not see the rejected charge: it waits for the refund, as the
// decisions after it on that key do, and all agree with the twin applied in
// order. (Before it waited, the script saw 8 + 5 of 10 and refused the 2
// that fit.)
func TestWindowScriptAfterRejectedCharge(t *testing.T) {
	h := newHarness(t)
	h.now.Set(10_000)
	if err := h.eng.LoadScripts(t.Context()); err != nil { // else NOSCRIPT sends the script calls after the refunds anyway
		t.Fatal(err)
	}
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 10 * policy.Micro, WindowMs: 1000}
	req := func(tenant string, cost int64, idem string) Request {
		return Request{Policy: "fw", Attributes: map[string]string{"tenant": tenant}, Cost: cost, Limits: &l, IdempotencyKey: idem}
	}
	res := h.eng.CheckBatch(t.Context(), []Request{req("a", 8, ""), req("a", 5, ""), req("b", 3, ""), req("a", 2, "k"), req("a", 1, ""), req("b", 3, "j")})
	var sa, sb policy.State
	for i, r := range []struct {
		s    *policy.State
		cost int64
	}{{&sa, 8}, {&sa, 5}, {&sb, 3}, {&sa, 2}, {&sa, 1}, {&sb, 3}} {
		var want policy.Decision
		var err error
		*r.s, want, err = policy.Apply(*r.s, l, 10_000, r.cost*policy.Micro)
		if err != nil {
			t.Fatal(err)
		}
		if res[i].Err != nil || res[i].Decision != want {
			t.Fatalf("decision %d: %+v %v, want %+v", i, res[i].Decision, res[i].Err, want)
		}
	}
	if got := h.state(policy.FixedWindow, "a"); got.Count != sa.Count {
		t.Fatalf("counter of a %d, want %d", got.Count, sa.Count)
	}
}

// Racers of different costs on the counted path: never more than the
// capacity, and the counter ends holding exactly what was admitted. Until
// a rejected charge is taken back a racer of smaller cost may be refused
// that a serial order would admit (docs/regional.md): the admitted total
// may fall short of the capacity, which the test reports.
func TestWindowMixedCostRace(t *testing.T) {
	h := newHarness(t)
	h.now.Set(1_000_000)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 100 * policy.Micro, WindowMs: 60_000}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 200 {
		wg.Go(func() {
			<-start
			cost := int64(i%7 + 1)
			d, err := h.eng.Check(t.Context(), Request{Policy: "fw", Attributes: map[string]string{"tenant": "costs"}, Cost: cost, Limits: &l})
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(cost)
			}
		})
	}
	close(start)
	wg.Wait()
	got := admitted.Load()
	if got > 100 {
		t.Fatalf("admitted %d units of a capacity of 100", got)
	}
	if s := h.state(policy.FixedWindow, "costs"); s.Count != got*policy.Micro {
		t.Fatalf("counter %d, want the %d admitted", s.Count, got)
	}
	t.Logf("admitted %d units of 100 to 200 racers of costs 1-7", got)
}
