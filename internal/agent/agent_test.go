package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

var tenantA = map[string]string{"tenant": "a"}

// The agent enforces its leased share, not the global limit: with eu
// holding a floor of 60 of a 100-per-10s quota, the us agent admits 40 of
// 150 checks of one tenant. With 4 shards the share is split as well, in
// parts of 10, and still exactly 40 are admitted; a cost one part cannot
// hold (11) is then refused as having no share, not as bad input: the
// whole limit could hold it.
func TestEnforcesLeasedShare(t *testing.T) {
	for _, shards := range []int{0, 4} {
		t.Run(fmt.Sprint(shards, "-shards"), func(t *testing.T) {
			ra := regionAgent(t, fmt.Sprintf("name: api\nidentity: [tenant]\nalgorithm: sliding_log\nlimit: 100\nperiod: 10s\nfloors: {eu: 60}\nshards: %d\n", shards), nil)
			ctx := t.Context()
			// Demand makes the share grow to what eu's floor leaves: 40.
			testenv.WaitFor(t, 10*time.Second, "us share to reach 40", func() bool {
				ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "warmup"}, Cost: 1})
				amt, m := ra.a.leaser.Enforce("api", "", time.Now())
				return m == lease.ModeLeased && amt == 40*policy.Micro
			})
			admitted := 0
			for i := 0; i < 150; i++ {
				o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
				if err != nil {
					t.Fatal(err)
				}
				if o.Allowed {
					admitted++
				}
				if o.Mode != lease.ModeLeased {
					t.Fatalf("check %d decided in mode %s", i, o.Mode)
				}
			}
			if admitted != 40 {
				t.Fatalf("admitted %d of 150 in one window, want exactly the leased 40 (not the global 100)", admitted)
			}
			if shards == 0 {
				return
			}
			o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "big"}, Cost: 11})
			if err != nil || o.Allowed || o.RetryAfterMs != admission.NoShareRetryMs {
				t.Fatalf("cost 11 against parts of 10: %+v %v, want refused for want of a share", o.Decision, err)
			}
		})
	}
}

// When the coordinator stops, the agent switches to the degraded budget
// exactly when its lease may have expired; when a coordinator is back it
// resumes leased mode.
func TestDegradedAtExpiryThenRecovers(t *testing.T) {
	k, ra := coordinatedAgent(t, apiPolicy+"failure: {mode: static-share, static_fraction: 0.2}\n", nil)
	ctx := t.Context()
	testenv.WaitFor(t, 10*time.Second, "a leased share above the static one", func() bool {
		ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		amt, m := ra.a.leaser.Enforce("api", "", time.Now())
		return m == lease.ModeLeased && amt > 20*policy.Micro
	})
	// Once a renewal has failed after the stop, none is in flight (the
	// lease loop renews in turn) and the grant is the last one.
	failures := counterValue(t, ra.a, "quotalease_agent_lease_renew_failures_total")
	k.stop()
	testenv.WaitFor(t, testTiming.ValidFor, "a renewal to fail", func() bool {
		return counterValue(t, ra.a, "quotalease_agent_lease_renew_failures_total") > failures
	})
	_, validUntil := heldGrant(ra.a, "api")
	// Each check is bracketed by two clock readings: its decision time is
	// somewhere between them.
	var before, after time.Time
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		before = time.Now()
		o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		after = time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if o.Mode == lease.ModeDegraded {
			if o.Limits.Rate != 20*policy.Micro {
				t.Fatalf("degraded budget %d, want the static 20/s", o.Limits.Rate)
			}
			break
		}
		if !before.Before(validUntil) {
			t.Fatalf("still %s in a check started at %v, after the lease may have expired (%v)", o.Mode, before, validUntil)
		}
		before = time.Time{}
	}
	if before.IsZero() {
		t.Fatal("never switched to degraded")
	}
	if early := validUntil.Sub(after); early > 0 {
		t.Fatalf("switched %v before the lease could have expired", early)
	}
	if late := before.Sub(validUntil); late > 50*time.Millisecond {
		t.Fatalf("switched %v after the lease may have expired", late)
	}
	// The time degraded is counted while it lasts.
	degradedAt := time.Now()
	time.Sleep(500 * time.Millisecond) // degraded time to count: it must pass
	// A coordinator comes back (a new leader on the same etcd state).
	startCoordinator(t, k.prefix, k.addr)
	testenv.WaitFor(t, 15*time.Second, "leased mode again", func() bool {
		o, _ := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		return o.Mode == lease.ModeLeased
	})
	counted := counterValue(t, ra.a, "quotalease_agent_degraded_seconds_total")
	if spent := time.Since(degradedAt).Seconds(); counted < 0.4 || counted > spent+1 {
		t.Fatalf("degraded seconds %.2f, want about the %.2f s spent degraded", counted, spent)
	}
}

// Envoy's rate-limit API, through go-control-plane's own client.
func TestEnvoyRateLimitService(t *testing.T) {
	client := envoyClient(t, "name: login\nidentity: [ip]\nalgorithm: sliding_log\n"+
		"limit: 5\nperiod: 1m\nscope: region\n", nil)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{{
		Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "login"}, {Key: "remote_address", Value: "10.1.2.3"}}}}}
	for i := 0; i < 5; i++ {
		resp, err := client.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %s, want OK", i, resp.OverallCode)
		}
		st := resp.Statuses[0]
		if st.CurrentLimit.RequestsPerUnit != 5 || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.LimitRemaining != uint32(4-i) {
			t.Fatalf("request %d: status %v", i, st)
		}
	}
	resp, err := client.ShouldRateLimit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("6th request: %v, want OVER_LIMIT", resp)
	}
	// Another IP has its own limit.
	req.Descriptors[0].Entries[1].Value = "10.9.9.9"
	if resp, _ := client.ShouldRateLimit(t.Context(), req); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another ip: %s", resp.OverallCode)
	}
	// A request without descriptors is refused as a whole, as
	// envoyproxy/ratelimit refuses it (envoy_parity_test.go has the codes).
	if _, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge"}); err == nil || !strings.Contains(err.Error(), "descriptor list must not be empty") {
		t.Fatalf("request without descriptors: %v", err)
	}
}

// The HTTP 429, header by header and body field by field.
func TestHTTP429Contract(t *testing.T) {
	ra := regionAgent(t, "name: search\nidentity: [user]\nalgorithm: fixed_window\nlimit: 2\nperiod: 1m\nscope: region\n", nil)
	roomInWindow(t, time.Minute)
	post := func(body string) *http.Response {
		resp, err := http.Post(ra.httpURL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	check := `{"policy":"search","attributes":{"user":"u1"}}`
	for i := 0; i < 2; i++ {
		if r := post(check); r.StatusCode != 200 || r.Header.Get("RateLimit-Remaining") != []string{"1", "0"}[i] {
			t.Fatalf("check %d: %d remaining %q", i, r.StatusCode, r.Header.Get("RateLimit-Remaining"))
		}
	}
	r := post(check)
	if r.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third check: %d, want 429", r.StatusCode)
	}
	h := r.Header
	wantHeaders := map[string]string{
		"Content-Type":        "application/problem+json",
		"Cache-Control":       "no-store",
		"RateLimit-Limit":     "2",
		"RateLimit-Remaining": "0",
		"RateLimit-Policy":    "2;w=60",
	}
	for k, v := range wantHeaders {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body %q: %v", raw, err)
	}
	retryMs := int64(body["retry_after_ms"].(float64))
	if retryMs <= 0 || retryMs > 60_000 {
		t.Fatalf("retry_after_ms %d", retryMs)
	}
	if got, want := h.Get("Retry-After"), strconv.FormatInt((retryMs+999)/1000, 10); got != want || got == "0" {
		t.Errorf("Retry-After %q, want %q (whole seconds, rounded up)", got, want)
	}
	if got := h.Get("RateLimit-Reset"); got != strconv.FormatInt((retryMs+999)/1000, 10) {
		t.Errorf("RateLimit-Reset %q, want %q", got, strconv.FormatInt((retryMs+999)/1000, 10))
	}
	wantBody := map[string]any{"type": httplimit.ProblemRateLimited, "title": "Too Many Requests", "status": float64(429), "policy": "search"}
	for k, v := range wantBody {
		if body[k] != v {
			t.Errorf("body %s = %v, want %v", k, body[k], v)
		}
	}
	if d, _ := body["detail"].(string); !strings.Contains(d, "search") {
		t.Errorf("detail %q does not name the policy", d)
	}
	if strings.Contains(string(raw), "rl:") || strings.Contains(string(raw), "{search") {
		t.Errorf("body leaks an internal key: %s", raw)
	}
	// Bad input: clear problems, never 5xx.
	for _, c := range []struct {
		body   string
		status int
		text   string
	}{
		{`{"policy":"nope","attributes":{"user":"u"}}`, 400, "unknown policy"},
		{`{"policy":"search","attributes":{}}`, 400, `needs attribute \"user\"`},
		{`{"policy":"search","attributes":{"user":"u"},"cost":-1}`, 400, "positive"},
		{`not json`, 400, "must be JSON"},
		{`{"policy":"search","attributes":{"user":"` + strings.Repeat("x", checkapi.MaxCheckBody) + `"}}`, 413, "larger than"},
	} {
		r := post(c.body)
		raw, _ := io.ReadAll(r.Body)
		if r.StatusCode != c.status || r.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(raw), c.text) {
			t.Errorf("%.40s: %d %s, want %d mentioning %q", c.body, r.StatusCode, raw, c.status, c.text)
		}
	}
	if r, _ := http.Get(ra.httpURL + "/v1/check"); r.StatusCode != 405 || r.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/check: %d", r.StatusCode)
	}
	if r, _ := http.Get(ra.httpURL + "/readyz"); r.StatusCode != 200 {
		t.Errorf("readyz: %d", r.StatusCode)
	}
	r2, _ := http.Get(ra.httpURL + "/metrics")
	m, _ := io.ReadAll(r2.Body)
	for _, want := range []string{`quotalease_agent_decisions_total{mode="region",policy="search",result="rejected"}`, "quotalease_agent_redis_seconds_bucket",
		// hashed by default: echo -n user=u1 | sha256sum
		`quotalease_agent_hot_identity_cost{identity="sha256:706a975c125e",policy="search"}`,
		`quotalease_build_info{component="regional-agent"`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(string(m), "u1") {
		t.Error("metrics name the identity in plain")
	}
}

// A TCP proxy in front of Redis adds latency above the check timeout, then
// cuts the connection: checks keep answering within the timeout, from the
// local fallback, whose admissions never exceed its budget.
func TestRedisSlowThenGone(t *testing.T) {
	// Region-scoped: the whole limit is this region's; one instance, so the
	// fallback budget is the full 20/s with a burst of 20.
	k := policyCoordinator(t, "name: api\nidentity: [tenant]\nlimit: 20\nperiod: 1s\nscope: region\n")
	proxy := startRedisBehindProxy(t)
	const timeout = 20 * time.Millisecond
	ra := startAgent(t, "us", proxy.Addr, []string{k.addr}, func(c *Config) { c.CheckTimeout = timeout })
	ctx := t.Context()
	// Healthy once the connection is dialed and the script loaded (the
	// first check may miss the 20 ms timeout on a loaded machine).
	testenv.WaitFor(t, 5*time.Second, "a healthy check decided by Redis", func() bool {
		o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "warm"}, Cost: 1})
		return err == nil && o.Mode == lease.ModeRegion
	})
	run := func(phase string, d time.Duration) (admitted int, elapsed time.Duration) {
		start := time.Now()
		for time.Since(start) < d {
			t0 := time.Now()
			o, err := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
			took := time.Since(t0)
			if err != nil {
				t.Fatalf("%s: %v", phase, err)
			}
			// Generous slack for a loaded machine; Redis itself now takes
			// 300 ms or forever, so a check waiting on it would show.
			if took > timeout+100*time.Millisecond {
				t.Fatalf("%s: a check took %v, the timeout is %v", phase, took, timeout)
			}
			if o.Mode != lease.ModeLocalFallback && o.Mode != lease.ModeRegion {
				t.Fatalf("%s: mode %s", phase, o.Mode)
			}
			if o.Allowed && o.Mode == lease.ModeLocalFallback {
				admitted++
			}
			time.Sleep(2 * time.Millisecond) // the pace of the load
		}
		return admitted, time.Since(start)
	}
	proxy.SetDelay(300 * time.Millisecond)
	slow, slowFor := run("slow", 1500*time.Millisecond)
	proxy.Cut()
	gone, goneFor := run("gone", 1500*time.Millisecond)
	// The fallback bucket (20/s, burst 20) started full once, at the first
	// fallback decision: at most 20 + 20/s over the whole outage.
	budget := 20 + 20*(slowFor+goneFor).Seconds()
	if total := float64(slow + gone); total > budget || total == 0 {
		t.Fatalf("fallback admitted %v over %v, budget %.0f", total, slowFor+goneFor, budget)
	}
	if !ra.a.admit.BreakerOpen() {
		t.Fatal("breaker not open while Redis is gone")
	}
	proxy.Restore()
	testenv.WaitFor(t, 5*time.Second, "Redis decisions again", func() bool {
		o, _ := ra.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		return o.Mode == lease.ModeRegion
	})
}

// A restarted agent forgets nothing that matters: the coordinator keeps
// counting the old process's grant until it expires, so the region cannot
// be granted twice.
func TestAgentRestartForgetsNoLease(t *testing.T) {
	k := policyCoordinator(t, apiPolicy)
	redisAddr := startRedis(t).Addr
	first := startAgent(t, "us", redisAddr, []string{k.addr}, nil)
	ctx := t.Context()
	testenv.WaitFor(t, 10*time.Second, "a share", func() bool {
		first.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		amt, _ := first.a.leaser.Enforce("api", "", time.Now())
		return amt > 50*policy.Micro
	})
	held, _ := first.a.leaser.Enforce("api", "", time.Now())
	first.stop()
	// The new process may already hold a grant of its own: it comes out of
	// what the region may enforce, not on top of it.
	startAgent(t, "us", redisAddr, []string{k.addr}, nil)
	adm := pb.NewAdminServiceClient(grpcConn(t, k.addr))
	ls, err := adm.ListLeases(ctx, &pb.ListLeasesRequest{Region: "us"})
	if err != nil || len(ls.Leases) != 1 {
		t.Fatalf("leases: %v %v", ls, err)
	}
	if ls.Leases[0].Enforcing < held {
		t.Fatalf("after the restart the coordinator books %d for us, but the old process held %d", ls.Leases[0].Enforcing, held)
	}
	if ls.Leases[0].Enforcing > 100*policy.Micro {
		t.Fatalf("us may enforce %d, above the limit", ls.Leases[0].Enforcing)
	}
}

// The gRPC check API, single and batch, with bad input in the batch.
func TestGRPCCheckAPI(t *testing.T) {
	ra := regionAgent(t, "name: api\nidentity: [tenant]\nlimit: 3\nperiod: 1m\nscope: region\n", nil)
	c := pb.NewCheckServiceClient(grpcConn(t, ra.grpcAddr))
	r, err := c.Check(t.Context(), &pb.CheckRequest{Policy: "api", Attributes: tenantA})
	if err != nil || !r.Allowed || r.Remaining != 2 || r.Mode != string(lease.ModeRegion) || r.Policy != "api" || r.Limit != 3 || r.PeriodMs != 60_000 {
		t.Fatalf("check: %v %v", r, err)
	}
	b, err := c.CheckBatch(t.Context(), &pb.CheckBatchRequest{Checks: []*pb.CheckRequest{
		{Policy: "api", Attributes: tenantA, Cost: 2},
		{Policy: "api", Attributes: tenantA},
		{Policy: "nope", Attributes: tenantA},
		{Policy: "api", Attributes: tenantA, Cost: 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := b.Results
	if !res[0].Response.Allowed || res[1].Response.Allowed || res[1].Response.RetryAfterMs <= 0 {
		t.Fatalf("batch decisions: %v", res)
	}
	if !strings.Contains(res[2].Error, "unknown policy") || !strings.Contains(res[3].Error, "never be admitted") {
		t.Fatalf("batch errors: %q %q", res[2].Error, res[3].Error)
	}
	if _, err := c.Check(t.Context(), &pb.CheckRequest{Policy: "api", Attributes: map[string]string{}}); err == nil {
		t.Fatal("missing identity accepted")
	}
}

// A policy stored after the agent started is usable within a couple of
// seconds: a check naming it triggers an early policy refresh, instead of
// waiting for the periodic one.
func TestNewPolicyUsableSoon(t *testing.T) {
	k, ra := coordinatedAgent(t, "name: old\nidentity: [tenant]\nlimit: 5\nperiod: 1s\nscope: region\n",
		func(c *Config) { c.PolicyRefresh = time.Hour })
	setPolicy(t, k.addr, "name: fresh\nidentity: [tenant]\nlimit: 5\nperiod: 1s\nscope: region\n")
	if _, err := ra.a.Check(t.Context(), admission.Request{Policy: "fresh", Attributes: tenantA}); err == nil || !strings.Contains(err.Error(), "unknown policy") {
		t.Fatalf("first check: %v, want unknown policy", err)
	}
	testenv.WaitFor(t, 3*time.Second, "the new policy to be known", func() bool {
		_, err := ra.a.Check(t.Context(), admission.Request{Policy: "fresh", Attributes: tenantA})
		return err == nil
	})
}

// Two agent replicas in one region share its lease without double-granting:
// each leases on its own, the coordinator counts the region at the larger
// grant (not the sum), and both see two live instances through Redis.
func TestTwoReplicasInOneRegion(t *testing.T) {
	k := policyCoordinator(t, apiPolicy)
	redisAddr := startRedis(t).Addr
	a := startAgent(t, "us", redisAddr, []string{k.addr}, nil)
	b := startAgent(t, "us", redisAddr, []string{k.addr}, func(c *Config) { c.Instance = "us-2" })
	ctx := t.Context()
	testenv.WaitFor(t, 10*time.Second, "both replicas leased and seeing each other", func() bool {
		a.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		b.a.Check(ctx, admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
		x, mx := a.a.leaser.Enforce("api", "", time.Now())
		y, my := b.a.leaser.Enforce("api", "", time.Now())
		return mx == lease.ModeLeased && my == lease.ModeLeased && x > 0 && y > 0 &&
			a.a.leaser.Instances() == 2 && b.a.leaser.Instances() == 2
	})
	x, _ := a.a.leaser.Enforce("api", "", time.Now())
	y, _ := b.a.leaser.Enforce("api", "", time.Now())
	ls, err := pb.NewAdminServiceClient(grpcConn(t, k.addr)).ListLeases(ctx, &pb.ListLeasesRequest{Region: "us"})
	if err != nil || len(ls.Leases) != 1 {
		t.Fatalf("leases: %v %v", ls, err)
	}
	if e := ls.Leases[0].Enforcing; e < max(x, y) || e > 100*policy.Micro {
		t.Fatalf("region booked at %d with replicas holding %d and %d: want the larger, within the limit", e, x, y)
	}
}
