package admission

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// fakeStore answers every ticket with decide, counting the tickets asked.
type fakeStore struct {
	asked  int
	decide func(t *Ticket) Decided
}

func (s *fakeStore) Decide(_ context.Context, ts []*Ticket) []Decided {
	out := make([]Decided, len(ts))
	for i, t := range ts {
		s.asked++
		out[i] = s.decide(t)
	}
	return out
}

// fixedShares grants every policy amount in mode.
type fixedShares struct {
	amount int64
	mode   lease.Mode
}

func (s *fixedShares) Enforce(_, _ string, _ time.Time) (int64, lease.Mode) { return s.amount, s.mode }
func (s *fixedShares) Instances() int                                       { return 1 }

var errDown = errors.New("store down")

// pipeline returns a pipeline over store with the agent's defaults, one
// global token bucket "api" (10/s, burst 10) leased in full, on clk.
func pipeline(t *testing.T, store Store, clk *clock.Manual, mod func(*Config)) (*Pipeline, *fixedShares) {
	t.Helper()
	ps, err := policy.ParsePolicies([]byte("name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\nburst: 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	var set PolicySet
	if err := set.Set(ps); err != nil {
		t.Fatal(err)
	}
	sh := &fixedShares{amount: ps[0].Limits().Amount(), mode: lease.ModeLeased}
	cfg := DefaultConfig()
	cfg.Policies, cfg.Store, cfg.Shares, cfg.Clock = &set, store, sh, clk
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, sh
}

var tenant = map[string]string{"tenant": "a"}

// Bad input is refused before the store is asked, with the sentinel the
// entry points map to "bad request"; cost 0 means the policy's default.
func TestPipelineRefusesBadInput(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	store := &fakeStore{decide: func(*Ticket) Decided { return Decided{Decision: policy.Decision{Allowed: true}} }}
	p, _ := pipeline(t, store, &clk, nil)
	for _, c := range []struct {
		r    Request
		want error
	}{
		{Request{Policy: "nope", Attributes: tenant}, ErrUnknownPolicy},
		{Request{Policy: "api", Attributes: tenant, Cost: -1}, policy.ErrInvalidCost},
		{Request{Policy: "api", Attributes: tenant, Cost: 11}, policy.ErrCostExceedsCapacity},
		{Request{Policy: "api", Attributes: map[string]string{}}, policy.ErrInvalidIdentity},
		{Request{Policy: "api", Attributes: tenant, IdempotencyKey: "has space"}, ErrInvalidRequest},
	} {
		_, err := p.Check(context.Background(), c.r)
		if !errors.Is(err, c.want) || !IsInputError(err) {
			t.Errorf("%+v: %v, want %v", c.r, err, c.want)
		}
	}
	if store.asked != 0 {
		t.Fatalf("the store was asked %d times for bad input", store.asked)
	}
	// An identity too long for a store key is refused here, once, not by
	// the store (which the fallback would stand in for).
	two, err := policy.ParsePolicies([]byte("name: two\nidentity: [a, b]\nlimit: 10\nperiod: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("%", policy.MaxAttributeValueBytes)
	if _, err := Resolve(two[0], Request{Attributes: map[string]string{"a": long, "b": long}}, two[0].Limits()); !errors.Is(err, policy.ErrInvalidIdentity) {
		t.Fatalf("an identity of %d escaped bytes: %v", 2*3*len(long), err)
	}
	if o, err := p.Check(context.Background(), Request{Policy: "api", Attributes: tenant}); err != nil || !o.Allowed || o.Via != ViaStore {
		t.Fatalf("cost 0 (the policy's default): %+v %v", o, err)
	}
}

// A share that cannot hold the cost refuses without the store, with the
// retry delay of the next lease round, in the lease's mode.
func TestPipelineNoShare(t *testing.T) {
	var clk clock.Manual
	store := &fakeStore{decide: func(*Ticket) Decided { return Decided{Decision: policy.Decision{Allowed: true}} }}
	p, sh := pipeline(t, store, &clk, nil)
	sh.amount, sh.mode = 0, lease.ModeDegraded
	o, err := p.Check(context.Background(), Request{Policy: "api", Attributes: tenant})
	if err != nil || o.Allowed || o.RetryAfterMs != NoShareRetryMs || o.Via != ViaNoShare || o.Mode != lease.ModeDegraded || store.asked != 0 {
		t.Fatalf("no share: %+v %v, store asked %d", o, err, store.asked)
	}
	sh.amount = sh.amount + 5*policy.Micro/10 // half a unit per second: a bucket of half a unit
	if o, _ := p.Check(context.Background(), Request{Policy: "api", Attributes: tenant}); o.Via != ViaNoShare {
		t.Fatalf("a share too small for one unit: %+v", o)
	}
}

// Three store failures in a row open the breaker: the fallback decides
// without asking the store until the cooldown, then one probe is let
// through. A probe the store refuses as bad input proves nothing and does
// not close the breaker.
func TestPipelineBreaker(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	down := true
	store := &fakeStore{decide: func(t *Ticket) Decided {
		if t.Identity == "tenant=bad" {
			return Decided{Err: policy.ErrInvalidIdentity}
		}
		if down {
			return Decided{Err: errDown}
		}
		return Decided{Decision: policy.Decision{Allowed: true}}
	}}
	p, _ := pipeline(t, store, &clk, nil)
	check := func(attrs map[string]string) (Outcome, error) {
		return p.Check(context.Background(), Request{Policy: "api", Attributes: attrs})
	}
	for i := 0; i < 3; i++ {
		if o, err := check(tenant); err != nil || o.Via != ViaFallback || o.Mode != lease.ModeLocalFallback {
			t.Fatalf("failure %d: %+v %v", i, o, err)
		}
	}
	if !p.BreakerOpen() || store.asked != 3 {
		t.Fatalf("after 3 failures: open %v, asked %d", p.BreakerOpen(), store.asked)
	}
	check(tenant)
	if store.asked != 3 {
		t.Fatal("the store was asked with the breaker open")
	}
	clk.Set(1_001_000)
	down = false
	if _, err := check(map[string]string{"tenant": "bad"}); !errors.Is(err, policy.ErrInvalidIdentity) || !p.BreakerOpen() {
		t.Fatalf("a refused probe: %v, open %v: want the error and the breaker still open", err, p.BreakerOpen())
	}
	if o, err := check(tenant); err != nil || o.Via != ViaStore || p.BreakerOpen() {
		t.Fatalf("a good probe: %+v %v, open %v", o, err, p.BreakerOpen())
	}
}

// With no request arriving, the breaker still closes once the store
// answers: ProbeStore pings only while the breaker is open and its
// cooldown has passed, a failed ping keeps it open for another cooldown, a
// good one closes it, and a ping the caller cancelled proves nothing.
func TestPipelineProbeStoreClosesIdleBreaker(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	store := &fakeStore{decide: func(*Ticket) Decided { return Decided{Err: errDown} }}
	p, _ := pipeline(t, store, &clk, nil)
	pings := 0
	var answer error
	ping := func(ctx context.Context) error {
		pings++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a ping without the store timeout")
		}
		return answer
	}
	if probed, _ := p.ProbeStore(context.Background(), ping); probed || pings != 0 {
		t.Fatalf("a closed breaker was probed (%d pings)", pings)
	}
	for i := 0; i < 3; i++ {
		p.Check(context.Background(), Request{Policy: "api", Attributes: tenant})
	}
	if !p.BreakerOpen() {
		t.Fatal("breaker not open after 3 failures")
	}
	if probed, _ := p.ProbeStore(context.Background(), ping); probed {
		t.Fatal("probed before the cooldown")
	}
	clk.Set(1_001_000)
	answer = errDown
	if probed, err := p.ProbeStore(context.Background(), ping); !probed || !errors.Is(err, errDown) || !p.BreakerOpen() {
		t.Fatalf("a failing ping: probed %v, %v, open %v", probed, err, p.BreakerOpen())
	}
	if probed, _ := p.ProbeStore(context.Background(), ping); probed {
		t.Fatal("probed again within the cooldown a failed ping restarted")
	}
	clk.Set(1_002_000)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if probed, _ := p.ProbeStore(cancelled, func(ctx context.Context) error { return ctx.Err() }); !probed || !p.BreakerOpen() {
		t.Fatal("a cancelled ping changed the breaker")
	}
	answer = nil
	if probed, err := p.ProbeStore(context.Background(), ping); !probed || err != nil || p.BreakerOpen() {
		t.Fatalf("a good ping (no request since the outage): probed %v, %v, open %v", probed, err, p.BreakerOpen())
	}
	if store.asked != 3 || pings != 2 {
		t.Fatalf("store asked %d times, pinged %d: want 3 and 2", store.asked, pings)
	}
}

// A rejection the store gave is answered from the over-limit cache until
// its retry delay passes, with the delay left; keyed requests are
// replayed, charged once; shadow mode admits what the limit rejects.
func TestPipelineCachesAndShadow(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	store := &fakeStore{decide: func(t *Ticket) Decided {
		return Decided{Decision: policy.Decision{RetryAfterMs: 500}}
	}}
	p, _ := pipeline(t, store, &clk, nil)
	r := Request{Policy: "api", Attributes: tenant}
	p.Check(context.Background(), r)
	clk.Set(1_000_200)
	if o, _ := p.Check(context.Background(), r); o.Via != ViaOverLimit || o.RetryAfterMs != 300 || store.asked != 1 {
		t.Fatalf("within the delay: %+v, store asked %d", o, store.asked)
	}
	clk.Set(1_000_500)
	if o, _ := p.Check(context.Background(), r); o.Via != ViaStore || store.asked != 2 {
		t.Fatalf("after the delay: %+v, store asked %d", o, store.asked)
	}
	keyed := Request{Policy: "api", Attributes: tenant, IdempotencyKey: "k1"}
	first, _ := p.Check(context.Background(), keyed)
	again, _ := p.Check(context.Background(), keyed)
	if again.Via != ViaReplay || again.Decision != first.Decision || store.asked != 3 {
		t.Fatalf("a retried key: %+v (first %+v), store asked %d", again, first, store.asked)
	}
	sp, _ := pipeline(t, store, &clk, func(c *Config) { c.Shadow = true })
	if o, _ := sp.Check(context.Background(), r); !o.Allowed || !o.Shadow || o.RetryAfterMs != 0 {
		t.Fatalf("shadow mode: %+v", o)
	}
}

// A batch answers in order: refused requests with their error, the rest
// decided by one store call.
func TestPipelineBatch(t *testing.T) {
	var clk clock.Manual
	calls := 0
	store := &fakeStore{decide: func(t *Ticket) Decided {
		return Decided{Decision: policy.Decision{Allowed: t.Identity == "tenant=a"}}
	}}
	counting := storeFunc(func(ctx context.Context, ts []*Ticket) []Decided { calls++; return store.Decide(ctx, ts) })
	p, _ := pipeline(t, counting, &clk, nil)
	res := p.CheckBatch(context.Background(), []Request{
		{Policy: "api", Attributes: tenant},
		{Policy: "nope", Attributes: tenant},
		{Policy: "api", Attributes: map[string]string{"tenant": "b"}},
	})
	if !res[0].Allowed || !errors.Is(res[1].Err, ErrUnknownPolicy) || res[2].Allowed || res[2].Err != nil || calls != 1 {
		t.Fatalf("batch: %+v, %d store calls", res, calls)
	}
}

type storeFunc func(ctx context.Context, ts []*Ticket) []Decided

func (f storeFunc) Decide(ctx context.Context, ts []*Ticket) []Decided { return f(ctx, ts) }
