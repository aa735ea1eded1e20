package quotalease_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsfake"
	"github.com/quota-lease/quota-lease/quotalease"
)

var acme = map[string]string{"policy": "api-per-tenant", "tenant": "acme"}

// newClient is a client of the fake server's address on clk, whose report
// timer never fires by itself (tests call ReportNow), closed with the test.
func newClient(t testing.TB, clk clock.Clock, mut func(*quotalease.Config), agents ...string) *quotalease.Client {
	t.Helper()
	cfg := quotalease.Config{Agents: agents, Domain: "edge", Clock: clk, ReportInterval: time.Hour,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}
	if mut != nil {
		mut(&cfg)
	}
	c, err := quotalease.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// assigned is a client whose bucket acme holds a token bucket of max
// tokens refilled perSecond, on a manual clock.
func assigned(t testing.TB, max, perSecond uint32, mut func(*quotalease.Config)) (*rlqsfake.Server, *clock.Manual, *quotalease.Client) {
	t.Helper()
	f := rlqsfake.Start(t)
	clk := &clock.Manual{}
	c := newClient(t, clk, mut, f.Addr)
	c.Allow(acme)
	f.WaitReports(t, 0, 1)
	f.Push(t, c, 0, rlqsfake.Assignment(acme, rlqsfake.TokenBucket(max, perSecond, time.Second), durationpb.New(time.Minute)))
	return f, clk, c
}

// A request of n units takes n tokens, or none when n do not fit; the
// decision says what is left and when the refused request would fit; the
// report counts units.
func TestAllowNTakesTheCost(t *testing.T) {
	f, _, c := assigned(t, 10, 10, nil)
	d := c.AllowN(acme, 4)
	if !d.Allowed || d.Remaining != 6 || d.Limit != 10 || d.Window != time.Second {
		t.Fatalf("AllowN(4) on a full bucket of 10: %+v, want allowed with 6 of 10 a second left", d)
	}
	d = c.AllowN(acme, 7)
	if d.Allowed || d.Remaining != 6 {
		t.Fatalf("AllowN(7) with 6 left: %+v, want refused, the 6 kept", d)
	}
	if want := 100 * time.Millisecond; d.RetryAfter < want-time.Millisecond || d.RetryAfter > want+time.Millisecond {
		t.Errorf("retry after %v, want %v (one token at 10 a second)", d.RetryAfter, want)
	}
	if d := c.AllowN(acme, 6); !d.Allowed || d.Remaining != 0 {
		t.Errorf("AllowN(6) with 6 left: %+v, want allowed, none left", d)
	}
	c.ReportNow()
	got := f.WaitReports(t, 0, 2)[1].GetBucketQuotaUsages()
	if len(got) != 1 || got[0].GetNumRequestsAllowed() != 10 || got[0].GetNumRequestsDenied() != 7 {
		t.Errorf("report %v, want 10 units allowed and 7 denied", got)
	}
}

// A stream the agent ends is opened again after a short wait, long
// before the next report (Envoy waits for it: 5 s).
func TestReconnectsBeforeTheNextReport(t *testing.T) {
	f := rlqsfake.Start(t)
	c := newClient(t, &clock.Manual{}, nil, f.Addr)
	c.Allow(acme)
	f.WaitReports(t, 0, 1)
	close(f.Stream(0).Kill)
	testenv.WaitFor(t, 10*time.Second, "a second stream", func() bool { return f.Count() == 2 })
	if s := c.Stats(); s.StreamsClosed != 1 || s.StreamStarts != 2 || s.PeriodicReports != 0 {
		t.Errorf("stats %+v: want one stream closed, two started, no report since", s)
	}
}

// With ReconnectWithReport, as Envoy, a closed stream stays closed until
// the next report.
func TestReconnectWithReportWaits(t *testing.T) {
	f := rlqsfake.Start(t)
	c := newClient(t, &clock.Manual{}, func(c *quotalease.Config) { c.ReconnectWithReport = true }, f.Addr)
	c.Allow(acme)
	f.WaitReports(t, 0, 1)
	close(f.Stream(0).Kill)
	testenv.WaitFor(t, 5*time.Second, "the stream closed", func() bool { return c.Stats().StreamsClosed == 1 })
	c.ReportNow()
	testenv.WaitFor(t, 5*time.Second, "a second stream with the report", func() bool { return f.Count() == 2 })
	if s := c.Stats(); s.StreamStarts != 2 || s.PeriodicReports != 1 {
		t.Errorf("stats %+v: want the second stream opened by the one report", s)
	}
}

// The first agent that answers gets the stream: a dead first address
// fails over to the next.
func TestFailsOverAcrossAgents(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	f := rlqsfake.Start(t)
	c := newClient(t, &clock.Manual{}, nil, dead, f.Addr)
	c.Allow(acme)
	f.WaitReports(t, 0, 1)
	if s := c.Stats(); s.StreamStarts < 1 {
		t.Errorf("stats %+v: no stream started", s)
	}
}

// A bucket without requests for ForgetAfter leaves the cache and the
// reports; one in use stays.
func TestForgetsUnusedBuckets(t *testing.T) {
	f := rlqsfake.Start(t)
	clk := &clock.Manual{}
	c := newClient(t, clk, func(c *quotalease.Config) { c.ForgetAfter = time.Minute }, f.Addr)
	other := map[string]string{"policy": "api-per-tenant", "tenant": "globex"}
	c.Allow(acme)
	c.Allow(other)
	f.WaitReports(t, 0, 2)
	clk.Set(int64(2 * time.Minute / time.Millisecond))
	c.Allow(other)
	c.ReportNow()
	got := f.WaitReports(t, 0, 3)[2].GetBucketQuotaUsages()
	if len(got) != 1 || got[0].GetBucketId().GetBucket()["tenant"] != "globex" {
		t.Errorf("report %v, want only the bucket in use", got)
	}
	if _, held := c.State(acme); held {
		t.Error("the unused bucket is still held")
	}
	if s := c.Stats(); s.Forgotten != 1 || s.Buckets != 1 {
		t.Errorf("stats %+v, want one forgotten, one held", s)
	}
}

// Without an assignment the configured behaviour decides: a DENY_ALL
// default refuses, and says to retry within a report interval.
func TestNoAssignmentBehaviour(t *testing.T) {
	f := rlqsfake.Start(t)
	c := newClient(t, &clock.Manual{}, func(c *quotalease.Config) {
		c.Buckets = envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}}
		c.ReportInterval = 2 * time.Second
	}, f.Addr)
	d := c.AllowN(acme, 1)
	if d.Allowed || d.RetryAfter != 2*time.Second {
		t.Errorf("first request under deny: %+v, want refused, retry in the report interval", d)
	}
	f.WaitReports(t, 0, 1)
	f.Push(t, c, 0, rlqsfake.Assignment(acme, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), durationpb.New(time.Minute)))
	if !c.Allow(acme) {
		t.Error("refused under an ALLOW_ALL assignment")
	}
}

// Bad settings are refused, each named.
func TestConfigRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  quotalease.Config
		want string
	}{
		{quotalease.Config{Domain: "d"}, "no agents"},
		{quotalease.Config{Domain: "d", Agents: []string{"a:1"}, Target: "dns:///b"}, "both Agents and Target"},
		{quotalease.Config{Agents: []string{"a:1"}}, "domain is empty"},
		{quotalease.Config{Agents: []string{"localhost"}, Domain: "d"}, "give each agent as host:port"},
		{quotalease.Config{Agents: []string{"a:1"}, Domain: "d", ReportInterval: -time.Second}, "report interval"},
		{quotalease.Config{Agents: []string{"a:1"}, Domain: "d",
			Buckets: envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.TokenBucket}}}, "token bucket"},
	} {
		_, err := quotalease.New(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
}

// Requests decided concurrently are all counted, and never more admitted
// than the bucket held.
func TestConcurrentLastTokens(t *testing.T) {
	f, _, c := assigned(t, 100, 1, nil)
	admitted := make(chan int, 8)
	for range 8 {
		go func() {
			n := 0
			for range 50 {
				if c.Allow(acme) {
					n++
				}
			}
			admitted <- n
		}()
	}
	total := 0
	for range 8 {
		total += <-admitted
	}
	if total != 100 {
		t.Errorf("%d admitted from a bucket of 100 on a still clock", total)
	}
	c.ReportNow()
	got := f.WaitReports(t, 0, 2)[1].GetBucketQuotaUsages()[0]
	if got.GetNumRequestsAllowed() != 100 || got.GetNumRequestsDenied() != 300 {
		t.Errorf("report %v, want 100 allowed and 300 denied", got)
	}
}

// A bucket's key depends on its pairs only, never on how values and keys
// could be run together.
func TestKeyIsTheMapsIdentity(t *testing.T) {
	a := quotalease.Key(map[string]string{"policy": "p", "tenant": "a"})
	if b := quotalease.Key(map[string]string{"tenant": "a", "policy": "p"}); a != b {
		t.Errorf("same pairs, keys %q and %q", a, b)
	}
	for _, pair := range [][2]map[string]string{
		{{"a": "b:c"}, {"a:b": "c"}},
		{{"a": "1", "b": "2"}, {"a": "12"}},
		{{"a": ""}, {}},
		{{"x": "1:1:x"}, {"x": "1", "1": "x"}},
	} {
		if quotalease.Key(pair[0]) == quotalease.Key(pair[1]) {
			t.Errorf("%v and %v share a key %q", pair[0], pair[1], quotalease.Key(pair[0]))
		}
	}
}

// A Bucket handle decides as the client does, and outlives its bucket: one
// the agent abandons starts again, reported anew, with the handle's next
// request.
func TestBucketHandle(t *testing.T) {
	f, _, c := assigned(t, 3, 1, nil)
	h := c.Bucket(acme)
	if d := h.AllowN(2); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("AllowN(2) of 3: %+v", d)
	}
	if c.Allow(acme) != true || h.Allow() != false {
		t.Fatal("the handle and the client do not share the bucket's tokens")
	}
	f.Push(t, c, 0, rlqsfake.Abandon(acme))
	if _, held := c.State(acme); held {
		t.Fatal("abandoned bucket still held")
	}
	first := c.Stats().FirstReports
	if !h.Allow() { // decided by the no-assignment behaviour: allow (the zero Settings)
		t.Error("the bucket started again refused its first request; the no-assignment behaviour allows it")
	}
	if _, held := c.State(acme); !held || c.Stats().FirstReports != first+1 {
		t.Errorf("the handle's request did not start the bucket again (first reports %d, were %d)", c.Stats().FirstReports, first)
	}
}

// An agent that stops answering without closing the connection (its host
// paused or partitioned away) is found by the keepalive pings, and the
// stream moves to the next agent.
func TestStalledAgentIsLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a keepalive ping and its timeout (15 s)")
	}
	stalls, next := rlqsfake.Start(t), rlqsfake.Start(t)
	px, err := faultproxy.Start(stalls.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	c := newClient(t, &clock.Manual{}, nil, px.Addr, next.Addr)
	c.Allow(acme)
	stalls.WaitReports(t, 0, 1)
	px.Stall()
	stalled := time.Now()
	testenv.WaitFor(t, 40*time.Second, "a stream on the next agent", func() bool { return next.Count() > 0 })
	t.Logf("the stream moved %v after the agent stalled", time.Since(stalled).Round(100*time.Millisecond))
}

// An agent that refuses the stream (at its most streams, draining) is
// left for the next, and refusals are not retried in a storm.
func TestRefusedStreamMovesOn(t *testing.T) {
	refuses, next := rlqsfake.Start(t), rlqsfake.Start(t)
	refuses.Refuse()
	c := newClient(t, &clock.Manual{}, nil, refuses.Addr, next.Addr)
	c.Allow(acme)
	if got := next.WaitReports(t, 0, 1); len(got[0].GetBucketQuotaUsages()) != 1 {
		t.Fatalf("the next agent got %v, want the bucket's first report", got)
	}
	if n := refuses.Refused(); n != 1 {
		t.Errorf("the refusing agent was asked %d times, want once", n)
	}
	// Both refuse: the client keeps trying, each wait twice the last (100,
	// 200, 400 ms: no report tick comes in between), so four attempts
	// take at least 700 ms however fast the machine.
	next.Refuse()
	c2 := newClient(t, &clock.Manual{}, nil, refuses.Addr, next.Addr)
	before := refuses.Refused() + next.Refused()
	start := time.Now()
	c2.Allow(acme)
	testenv.WaitFor(t, 10*time.Second, "four refused attempts", func() bool {
		return refuses.Refused()+next.Refused()-before >= 4
	})
	if took := time.Since(start); took < 700*time.Millisecond {
		t.Errorf("four refused attempts in %v: the waits between them do not grow (100, 200, 400 ms)", took)
	}
}

// A refused request is never told to wait past the end of its bucket's
// assignment, however slowly the bucket refills.
func TestRetryAfterEndsWithTheAssignment(t *testing.T) {
	f, _, c := assigned(t, 1, 1, nil)
	// One token a minute, assigned for 10 s.
	f.Push(t, c, 0, rlqsfake.Assignment(acme, rlqsfake.TokenBucket(1, 1, time.Minute), durationpb.New(10*time.Second)))
	c.Allow(acme) // the last token
	if d := c.AllowN(acme, 1); d.Allowed || d.RetryAfter != 10*time.Second {
		t.Errorf("refused on a bucket of a token a minute assigned for 10 s: %+v, want retry after 10s", d)
	}
}
