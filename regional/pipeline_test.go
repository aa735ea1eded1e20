package regional

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// countingClient counts the round trips sent through it: pipelines and
// script calls made on their own.
type countingClient struct {
	Client
	trips atomic.Int64
}

func (c *countingClient) Pipeline() redis.Pipeliner {
	c.trips.Add(1)
	return c.Client.Pipeline()
}

func (c *countingClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	c.trips.Add(1)
	return c.Client.EvalSha(ctx, sha, keys, args...)
}

func (c *countingClient) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	c.trips.Add(1)
	return c.Client.Eval(ctx, src, keys, args...)
}

// Concurrent checks through a pipelined engine share round trips and stay
// exact: 200 racers for the last 37 units of every algorithm get exactly
// 37, many calls go out per round trip, and after Close checks go on alone.
func TestPipelinedChecksShareRoundTripsAndStayExact(t *testing.T) {
	const racers, left = 200, 37
	srv := redistest.Start(t)
	cc := &countingClient{Client: srv.Client(t)}
	var now clock.Manual
	now.Set(1_000_000) // frozen clock: no refill during the race
	eng := newEngine(t, cc, testPolicies(t), Config{Clock: &now, Pipelines: 2})
	defer eng.Close()
	calls := 0
	for _, l := range raceLimits {
		req := Request{Policy: algPolicy[l.Algorithm], Attributes: map[string]string{"tenant": "race"}, Cost: 100 - left, Limits: &l}
		if _, err := eng.Check(context.Background(), req); err != nil { // leave exactly `left`
			t.Fatal(err)
		}
		before := cc.trips.Load()
		got := race(t, eng, l, "race", racers)
		calls += racers
		if got != left {
			t.Fatalf("%s: %d of %d racers admitted, want exactly %d", l.Algorithm, got, racers, left)
		}
		t.Logf("%s: %d checks in %d round trips", l.Algorithm, racers, cc.trips.Load()-before)
	}
	if p := cc.trips.Load(); p > int64(calls)*3/4 {
		t.Fatalf("%d concurrent checks took %d round trips: they do not share them", calls, p)
	}
	eng.Close()
	if d, err := eng.Check(context.Background(), Request{Policy: "tb", Attributes: map[string]string{"tenant": fmt.Sprint("after-close")}, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("check after Close: %+v %v", d, err)
	}
}

// A check whose context ends while Redis is stopped returns with the
// context's error at its deadline, pipelined as directly, and the engine
// decides again once Redis is back.
func TestPipelinedCheckTimesOut(t *testing.T) {
	srv := redistest.Start(t)
	eng := newEngine(t, srv.Client(t), testPolicies(t), Config{Pipelines: 1})
	defer eng.Close()
	if err := eng.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := eng.Check(ctx, Request{Policy: "tb", Attributes: map[string]string{"tenant": "a"}, Cost: 1})
	cancel()
	if err == nil {
		t.Fatal("a check against a stopped Redis returned no error")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if d, err := eng.Check(ctx, Request{Policy: "tb", Attributes: map[string]string{"tenant": "b"}, Cost: 1}); err != nil || !d.Allowed {
		t.Fatalf("after Redis resumed: %+v %v", d, err)
	}
}
