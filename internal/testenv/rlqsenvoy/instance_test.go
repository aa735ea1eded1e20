package rlqsenvoy

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsfake"
)

var (
	tenantA = map[string]string{"tenant": "a", "name": "api"}
	tenantB = map[string]string{"tenant": "b", "name": "api"}
)

func usage(id map[string]string, elapsed int64, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: id},
		TimeElapsed: &durationpb.Duration{Seconds: elapsed}, NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func reportOf(us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us}
}

// A bucket's first request opens the stream and is reported at once,
// alone, with the domain; later requests of it wait for the timer; another
// new bucket is reported at once too.
func TestFirstRequestReportsAtOnce(t *testing.T) {
	f := rlqsfake.Start(t)
	var clk clock.Manual
	in := newTestInstance(t, f, &clk, nil)
	if f.Count() != 0 {
		t.Fatal("a stream opened before any request")
	}
	if d := in.Allow(tenantA); !d.Allowed {
		t.Fatal("first request denied with no no_assignment_behavior (Envoy allows)")
	}
	got := f.WaitReports(t, 0, 1)
	if want := reportOf(usage(tenantA, 0, 1, 0)); !sameMsg(got[0], want) {
		t.Fatalf("first report %v, want %v", got[0], want)
	}
	clk.Set(3000)
	in.Allow(tenantA)
	in.Allow(tenantA)
	in.Allow(tenantB)
	got = f.WaitReports(t, 0, 2)
	if want := reportOf(usage(tenantB, 0, 1, 0)); !sameMsg(got[1], want) {
		t.Fatalf("second bucket's first report %v, want %v", got[1], want)
	}
	// The two later requests of tenantA are in the next periodic report,
	// 3 s after its first report.
	in.ReportNow()
	got = f.WaitReports(t, 0, 3)
	if want := reportOf(usage(tenantA, 3, 2, 0), usage(tenantB, 0, 0, 0)); !sameMsg(got[2], want) {
		t.Fatalf("periodic report %v, want %v", got[2], want)
	}
	if s := in.Stats(); s.FirstReports != 2 || s.PeriodicReports != 1 || s.Sent != 3 || s.StreamStarts != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Every tick reports every bucket, idle ones too, with the counts since
// the last report (then reset) and the time since it in whole seconds.
func TestPeriodicReportsEveryBucket(t *testing.T) {
	f, clk, in := withBucket(t, nil)
	clk.Set(4999)
	allowN(in, tenantA, 5)
	in.ReportNow()
	got := f.WaitReports(t, 0, 2)
	if want := reportOf(usage(tenantA, 4, 5, 0)); !sameMsg(got[1], want) { // 4.999 s reads 4 s
		t.Fatalf("report %v, want %v", got[1], want)
	}
	clk.Set(10000)
	in.ReportNow()
	got = f.WaitReports(t, 0, 3)
	if want := reportOf(usage(tenantA, 5, 0, 0)); !sameMsg(got[2], want) {
		t.Fatalf("idle report %v, want %v", got[2], want)
	}
}

// The report timer fires on its own every ReportInterval once the first
// bucket started it.
func TestReportTimerRuns(t *testing.T) {
	f := rlqsfake.Start(t)
	cfg := testConfig(f.Addr, "envoy-t", clock.System(), 20*time.Millisecond)
	cfg.InitialMetadata = metadata.Pairs("x-envoy-node", "envoy-t")
	in := startInstance(t, cfg)
	in.Allow(tenantA)
	got := f.WaitReports(t, 0, 4)
	for _, r := range got[1:] {
		if r.GetDomain() != "edge" || len(r.GetBucketQuotaUsages()) != 1 {
			t.Fatalf("periodic report %v", r)
		}
	}
	if md := f.Stream(0).MD.Get("x-envoy-node"); len(md) != 1 || md[0] != "envoy-t" {
		t.Fatalf("initial metadata %v", md)
	}
}

// A token bucket assignment is enforced locally: its burst, its refill.
// Re-sending the same one (a TTL refresh) keeps the tokens; a different
// one starts from the old bucket's fill ratio; one that replaces a blanket
// rule starts full.
func TestTokenBucketAssignment(t *testing.T) {
	f, clk, in := withBucket(t, nil)

	tb := rlqsfake.TokenBucket(4, 2, time.Second) // 2 tokens a second, burst 4
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, tb, ttlOf(time.Minute)))
	if n := allowN(in, tenantA, 10); n != 4 {
		t.Fatalf("admitted %d of 10 on a fresh bucket of 4, want 4 (it starts full)", n)
	}
	clk.Set(1500) // 1.5 s: 3 tokens
	if n := allowN(in, tenantA, 10); n != 3 {
		t.Fatalf("admitted %d after 1.5 s at 2/s, want 3", n)
	}
	// The same assignment again: tokens kept (0.0 now, not refilled).
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(4, 2, time.Second), ttlOf(time.Minute)))
	if n := allowN(in, tenantA, 10); n != 0 {
		t.Fatalf("an unchanged assignment refilled the bucket: admitted %d", n)
	}
	// Half full, then a new assignment of max 10: starts at 10 × 2/4 = 5.
	clk.Set(2500)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(10, 1, time.Second), ttlOf(time.Minute)))
	if n := allowN(in, tenantA, 20); n != 5 {
		t.Fatalf("admitted %d from a replaced bucket, want 5 (old fill ratio 2/4 of 10)", n)
	}
	// Blanket rule in between: the next token bucket starts full.
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), ttlOf(time.Minute)))
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(3, 1, time.Second), ttlOf(time.Minute)))
	if n := allowN(in, tenantA, 10); n != 3 {
		t.Fatalf("admitted %d after a blanket rule, want 3 (full)", n)
	}
	in.ReportNow()
	got := f.WaitReports(t, 0, 2)
	if u := got[1].GetBucketQuotaUsages()[0]; u.GetNumRequestsAllowed() != 15 || u.GetNumRequestsDenied() != 45 {
		t.Fatalf("reported %v, want 15 allowed, 45 denied", u)
	}
}

// Envoy's token bucket quirks: fill intervals truncated to whole seconds
// (under one second: never empties), and only the nanos of the fill
// interval compared, so a change of its seconds alone keeps the old rate.
func TestTokenBucketQuirks(t *testing.T) {
	f := rlqsfake.Start(t)
	var clk clock.Manual
	in := newTestInstance(t, f, &clk, nil)
	in.Allow(tenantA)
	in.Allow(tenantB)
	f.WaitReports(t, 0, 2)

	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(2, 1, 500*time.Millisecond), ttlOf(time.Minute)))
	if n := allowN(in, tenantA, 100); n != 100 {
		t.Fatalf("fill interval 0.5 s: admitted %d of 100, want all (Envoy divides by zero seconds)", n)
	}

	f.Push(t, in, 0, rlqsfake.Assignment(tenantB, rlqsfake.TokenBucket(1, 1, time.Second), ttlOf(time.Minute)))
	allowN(in, tenantB, 1)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantB, rlqsfake.TokenBucket(1, 1, 10*time.Second), ttlOf(time.Minute)))
	clk.Set(1000)
	if n := allowN(in, tenantB, 5); n != 1 {
		t.Fatalf("admitted %d after 1 s; want 1: the 1 s rate is kept when only the interval's seconds change", n)
	}
}

// An assignment lasts its TTL's whole seconds from receipt; then the
// expired-assignment fallback for its timeout; then the default action.
// An unset or sub-second TTL expires at once.
func TestExpiry(t *testing.T) {
	f := rlqsfake.Start(t)
	var clk clock.Manual
	set := settingsWith(func(s *rlqfv3.RateLimitQuotaBucketSettings) {
		s.NoAssignmentBehavior = noAssignment(rlqsfake.Blanket(typev3.RateLimitStrategy_DENY_ALL))
		s.ExpiredAssignmentBehavior = expiredFallback(3*time.Second, rlqsfake.TokenBucket(2, 1, time.Second))
		s.DenyResponseSettings = &rlqfv3.RateLimitQuotaBucketSettings_DenyResponseSettings{
			HttpStatus: &typev3.HttpStatus{Code: typev3.StatusCode_ServiceUnavailable}}
	})
	in := newTestInstance(t, f, &clk, set)
	if d := in.Allow(tenantA); d.Allowed || d.Status != http.StatusServiceUnavailable {
		t.Fatalf("first request under DENY_ALL no-assignment: %+v, want denied with 503", d)
	}
	f.WaitReports(t, 0, 1)
	if got := f.Stream(0).Got()[0].GetBucketQuotaUsages()[0]; got.GetNumRequestsDenied() != 1 {
		t.Fatalf("first report %v, want one denied", got)
	}

	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), ttlOf(2900*time.Millisecond)))
	clk.Set(1999)
	if !in.Allow(tenantA).Allowed {
		t.Fatal("denied within the TTL")
	}
	clk.Set(2000) // 2.9 s counts as 2 s: expired; the fallback token bucket (2) starts full
	if n := allowN(in, tenantA, 5); n != 2 {
		t.Fatalf("admitted %d under the fallback bucket of 2, want 2", n)
	}
	clk.Set(4999)
	if n := allowN(in, tenantA, 5); n != 2 {
		t.Fatalf("admitted %d after 3 s of fallback refill at 1/s (capped at 2), want 2", n)
	}
	clk.Set(5000) // fallback timeout (3 s) over: the default action, DENY_ALL
	if n := allowN(in, tenantA, 5); n != 0 {
		t.Fatalf("admitted %d after the fallback's timeout, want 0 (no-assignment DENY_ALL)", n)
	}
	if st, ok := in.State(tenantA); !ok || st.Strategy != nil {
		t.Fatalf("state %+v %v, want the default action (the bucket is not abandoned)", st, ok)
	}

	// Unset TTL: expires at once (the API says never; Envoy reads 0 s).
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), nil))
	if st, _ := in.State(tenantA); st.Assigned {
		t.Fatalf("an assignment without TTL still active: %+v", st)
	}
}

// reuse_last_assignment is not implemented by Envoy: an expired bucket goes
// straight to its default action.
func TestReuseLastAssignmentIgnored(t *testing.T) {
	set := settingsWith(func(s *rlqfv3.RateLimitQuotaBucketSettings) {
		s.NoAssignmentBehavior = noAssignment(rlqsfake.Blanket(typev3.RateLimitStrategy_DENY_ALL))
		s.ExpiredAssignmentBehavior = &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(time.Minute),
			ExpiredAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_ReuseLastAssignment_{
				ReuseLastAssignment: &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_ReuseLastAssignment{}}}
	})
	f, clk, in := withBucket(t, set)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), ttlOf(time.Second)))
	clk.Set(1000)
	if in.Allow(tenantA).Allowed {
		t.Fatal("allowed after expiry: reuse_last_assignment applied, Envoy ignores it")
	}
}

// Actions Envoy ignores leave the bucket as it was, TTL included:
// requests_per_time_unit, no strategy, unknown buckets, empty ids.
func TestIgnoredActions(t *testing.T) {
	f, clk, in := withBucket(t, nil)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_DENY_ALL), ttlOf(2*time.Second)))
	clk.Set(1000)
	rptu := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 100, TimeUnit: typev3.RateLimitUnit_SECOND}}}
	f.Push(t, in, 0,
		rlqsfake.Assignment(tenantA, rptu, ttlOf(time.Minute)),
		rlqsfake.Assignment(tenantA, nil, ttlOf(time.Minute)),
		rlqsfake.Assignment(tenantB, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), ttlOf(time.Minute)),
		rlqsfake.Assignment(map[string]string{}, rlqsfake.Blanket(typev3.RateLimitStrategy_ALLOW_ALL), ttlOf(time.Minute)))
	if in.Allow(tenantA).Allowed {
		t.Fatal("requests_per_time_unit replaced the DENY_ALL assignment; Envoy ignores it")
	}
	if _, ok := in.State(tenantB); ok {
		t.Fatal("a response created a bucket the instance never reported")
	}
	clk.Set(2000) // the DENY_ALL's TTL was not refreshed by the ignored actions
	if !in.Allow(tenantA).Allowed {
		t.Fatal("the ignored actions refreshed the TTL")
	}
	if s := in.Stats(); s.Ignored != 4 || s.Assignments != 1 {
		t.Fatalf("stats %+v, want 4 ignored, 1 applied", s)
	}
}

// Abandon erases the bucket and its unreported usage; the next request
// starts it afresh (no-assignment behaviour, a report at once). The
// instance's own records keep every admission.
func TestAbandon(t *testing.T) {
	f, clk, in := withBucket(t, nil)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(1, 1, time.Minute), ttlOf(time.Minute)))
	allowN(in, tenantA, 3) // 1 admitted, 2 denied, never reported
	f.Push(t, in, 0, rlqsfake.Abandon(tenantA))
	if _, ok := in.State(tenantA); ok {
		t.Fatal("bucket still cached after abandon")
	}
	clk.Set(2000)
	if !in.Allow(tenantA).Allowed {
		t.Fatal("a re-created bucket kept the abandoned token bucket")
	}
	got := f.WaitReports(t, 0, 2)
	if want := reportOf(usage(tenantA, 0, 1, 0)); !sameMsg(got[1], want) {
		t.Fatalf("report after abandon %v, want a new first report %v", got[1], want)
	}
	recs := in.Records()
	if len(recs) != 1 || len(recs[0].Admitted) != 3 || recs[0].Denied != 2 {
		t.Fatalf("records %+v, want 3 admitted and 2 denied across the abandon", recs)
	}
	if n := recs[0].AdmittedIn(time.UnixMilli(1000), time.UnixMilli(3000)); n != 1 {
		t.Fatalf("admitted in [1 s, 3 s): %d, want 1", n)
	}
	if s := in.Stats(); s.Abandoned != 1 || s.Buckets != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// When the server ends the stream, buckets keep their assignments until
// their TTL; first reports made meanwhile are dropped; the next tick opens
// a new stream whose first message reports every bucket, with the domain.
func TestReconnectOnTick(t *testing.T) {
	f, clk, in := withBucket(t, nil)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.Blanket(typev3.RateLimitStrategy_DENY_ALL), ttlOf(10*time.Second)))

	close(f.Stream(0).Kill)
	testenv.WaitFor(t, 5*time.Second, "the stream's end seen", func() bool { return in.Stats().StreamsClosed == 1 })
	clk.Set(9000)
	if in.Allow(tenantA).Allowed {
		t.Fatal("the assignment was dropped with the stream; Envoy keeps it until its TTL")
	}
	in.Allow(tenantB) // its first report has no stream: dropped
	testenv.WaitFor(t, 5*time.Second, "the first report dropped", func() bool { return in.Stats().Dropped == 1 })
	if f.Count() != 1 {
		t.Fatal("a new bucket reopened the stream; only the report timer does")
	}
	in.ReportNow()
	got := f.WaitReports(t, 1, 1)
	// tenantB's request went with its dropped first report.
	if want := reportOf(usage(tenantA, 9, 0, 1), usage(tenantB, 0, 0, 0)); !sameMsg(got[0], want) {
		t.Fatalf("first message on the new stream %v, want %v", got[0], want)
	}
	clk.Set(10000)
	if !in.Allow(tenantA).Allowed {
		t.Fatal("the assignment outlived its TTL")
	}
	if s := in.Stats(); s.StreamStarts != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A tick while the server is unreachable drops the report (counts already
// reset); ticks keep trying, and the stream comes back with the server.
func TestReconnectAfterServerDown(t *testing.T) {
	f := rlqsfake.Start(t)
	var clk clock.Manual
	proxy, err := faultproxy.Start(f.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() }) // closed after the instance: cleanups run in reverse
	cfg := testConfig(proxy.Addr, "envoy-r", &clk, time.Hour)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond,
		Multiplier: 1.2, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))
	in := startInstance(t, cfg)
	in.Allow(tenantA)
	f.WaitReports(t, 0, 1)
	proxy.Cut()
	testenv.WaitFor(t, 5*time.Second, "the stream's end seen", func() bool { return in.Stats().StreamsClosed == 1 })
	allowN(in, tenantA, 4)
	in.ReportNow()
	testenv.WaitFor(t, 10*time.Second, "the report dropped", func() bool {
		s := in.Stats()
		return s.StreamFailures >= 1 && s.Dropped >= 1
	})
	proxy.Restore()
	clk.Set(6000)
	testenv.WaitFor(t, 10*time.Second, "a new stream", func() bool {
		in.ReportNow()
		return f.Count() >= 2 && len(f.Stream(f.Count()-1).Got()) > 0
	})
	got := f.Stream(f.Count() - 1).Got()[0]
	if len(got.GetBucketQuotaUsages()) != 1 || got.GetDomain() != "edge" || got.GetBucketQuotaUsages()[0].GetNumRequestsAllowed() != 0 {
		t.Fatalf("first message after the outage %v, want tenant a with no requests (the 4 were in a dropped report)", got)
	}
}

// Close stops the stream, every goroutine and the connection.
func TestCloseStopsEverything(t *testing.T) {
	f := rlqsfake.Start(t)
	before := runtime.NumGoroutine()
	var clk clock.Manual
	cfg := testConfig(f.Addr, "envoy-c", &clk, 10*time.Millisecond)
	in, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.Allow(tenantA)
	f.WaitReports(t, 0, 2)
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the server to see the stream end", func() bool {
		return f.Stream(0).Ended()
	})
	testenv.WaitFor(t, 5*time.Second, "goroutines back to before", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// Many instances in one process: one stream each, records per instance.
func TestFleet(t *testing.T) {
	f := rlqsfake.Start(t)
	var clk clock.Manual
	fl, err := NewFleet(context.Background(), 20, func(i int) Config {
		return testConfig(f.Addr, fmt.Sprintf("envoy-%d", i), &clk, time.Hour)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	for _, in := range fl.Instances {
		in.Allow(tenantA)
		in.Allow(tenantA)
	}
	testenv.WaitFor(t, 5*time.Second, "20 streams", func() bool { return f.Count() == 20 })
	if s := fl.Stats(); s.Allowed != 40 || s.StreamStarts != 20 {
		t.Fatalf("fleet stats %+v", s)
	}
	recs := fl.Records()
	if len(recs) != 20 || recs[0].InstanceName == recs[1].InstanceName {
		t.Fatalf("records %+v", recs)
	}
}

// Bad configurations are refused with every reason, before anything
// starts; a token bucket as no_assignment_behavior among them.
func TestConfigRefused(t *testing.T) {
	cfg := Config{Settings: settingsWith(func(s *rlqfv3.RateLimitQuotaBucketSettings) {
		s.NoAssignmentBehavior = noAssignment(rlqsfake.TokenBucket(1, 1, time.Second))
	})}
	_, err := New(context.Background(), cfg)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"target", "domain", "report interval", "clock", "send queue", "no_assignment_behavior"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	bad := DefaultConfig()
	bad.Target, bad.Domain = "127.0.0.1:1", "edge"
	bad.Settings = &rlqfv3.RateLimitQuotaBucketSettings{} // reporting_interval is required
	if _, err := New(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "ReportingInterval") {
		t.Fatalf("settings without reporting_interval: %v", err)
	}
}

// Requests decided from many goroutines while reports and assignments
// flow are all counted: with the stream up throughout, the reports account
// for every request, and the records for every admission.
func TestConcurrentRequestsAllReported(t *testing.T) {
	f := rlqsfake.Start(t)
	in := startInstance(t, testConfig(f.Addr, "envoy-load", clock.System(), 5*time.Millisecond))
	in.Allow(tenantA)
	f.WaitReports(t, 0, 1)
	f.Stream(0).Out <- &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
		rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(500, 1000, time.Second), ttlOf(time.Minute))}}
	const workers, each = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				in.Allow(map[string]string{"tenant": fmt.Sprint((w + i) % 5)})
				in.Allow(tenantA)
			}
		}()
	}
	wg.Wait()
	total := 1 + 2*workers*each
	var reported uint64
	testenv.WaitFor(t, 5*time.Second, "every request reported", func() bool {
		in.ReportNow()
		reported = 0
		for _, r := range f.Stream(0).Got() {
			for _, u := range r.GetBucketQuotaUsages() {
				reported += u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
			}
		}
		return reported == uint64(total)
	})
	s := in.Stats()
	if s.Allowed+s.Denied != uint64(total) || s.Dropped != 0 {
		t.Fatalf("stats %+v, want %d requests and nothing dropped", s, total)
	}
	admitted := 0
	for _, r := range in.Records() {
		admitted += len(r.Admitted)
	}
	if uint64(admitted) != s.Allowed {
		t.Fatalf("records hold %d admissions, stats %d", admitted, s.Allowed)
	}
}
