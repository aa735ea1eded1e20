package agent

import (
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// One odd descriptor never switches limiting off for the others: an
// unknown policy, a missing attribute or a descriptor naming no policy is
// answered OK with no limit (as envoyproxy/ratelimit answers an unmatched
// one), the call never fails, and the valid descriptor is limited as
// usual. A very long value is limited like any other (by its hash), not a
// way around the limit. Before, any of these failed the whole call, which
// Envoy's default failure_mode_deny: false turns into "allow everything".
// With --envoy-retry-after, a rejected call carries exactly one
// retry-after.
func TestEnvoyOddDescriptorDoesNotDisableLimiting(t *testing.T) {
	client := envoyClient(t, "name: api\nidentity: [user]\nalgorithm: fixed_window\n"+
		"limit: 3\nperiod: 1m\nscope: region\n",
		func(c *Config) { c.EnvoyRetryAfter = true })
	roomInWindow(t, time.Minute)
	long := strings.Repeat("v", 4000)
	odd := []*commonrl.RateLimitDescriptor{
		entries("generic_key", "nope", "user", "u"), // unknown policy
		entries("generic_key", "api"),               // lacks the attribute
		entries("user", "u"),                        // names no policy
	}
	for i := 0; i < 5; i++ {
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: append([]*commonrl.RateLimitDescriptor{entries("generic_key", "api", "user", "alice")}, odd...)}
		resp, err := client.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatalf("call %d failed: %v", i, err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i >= 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want || resp.Statuses[0].Code != want {
			t.Fatalf("call %d: %v, want %s for alice", i, resp, want)
		}
		for j, st := range resp.Statuses[1:] {
			if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
				t.Fatalf("call %d: odd descriptor %d answered %v, want OK with no limit", i, j, st)
			}
		}
		if i >= 3 {
			var ra []string
			for _, h := range resp.ResponseHeadersToAdd {
				if h.Key == "retry-after" {
					ra = append(ra, h.Value)
				}
			}
			if len(ra) != 1 {
				t.Fatalf("call %d: retry-after headers %v, want exactly one", i, ra)
			}
		}
	}
	// Long values are counted, not refused: 3 admitted, then over.
	for i := 0; i < 4; i++ {
		resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{entries("generic_key", "api", "user", long)}})
		if err != nil {
			t.Fatalf("long value, call %d: %v", i, err)
		}
		if got, want := resp.OverallCode, map[bool]rlsv3.RateLimitResponse_Code{true: rlsv3.RateLimitResponse_OK, false: rlsv3.RateLimitResponse_OVER_LIMIT}[i < 3]; got != want {
			t.Fatalf("long value, call %d: %s, want %s", i, got, want)
		}
	}
}

// A descriptor's own hits_addend overrides the request's, and more hits
// than the limit holds are over the limit (never admitted), not an error.
func TestEnvoyHitsAddendPerDescriptor(t *testing.T) {
	client := envoyClient(t, "name: api\nidentity: [user]\nalgorithm: fixed_window\n"+
		"limit: 10\nperiod: 1m\nscope: region\n", nil)
	roomInWindow(t, time.Minute)
	d := entries("generic_key", "api", "user", "bob")
	d.HitsAddend = wrapperspb.UInt64(4)
	resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if err != nil || resp.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("hits_addend 4 on the descriptor (1 on the request): %v %v, want 6 remaining", resp, err)
	}
	d.HitsAddend = wrapperspb.UInt64(11)
	resp, err = client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("11 hits against a limit of 10: %v %v, want OVER_LIMIT", resp, err)
	}
	d.HitsAddend = nil
	resp, _ = client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{d}})
	if resp.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("after the refused 11 hits: %v, want 5 remaining (nothing charged)", resp.Statuses[0])
	}
}

// With the limit headers on, an answer carries RateLimit-Limit, -Remaining
// and -Reset of the descriptor closest to its limit.
func TestEnvoyLimitHeaders(t *testing.T) {
	client := envoyClient(t, "name: api\nidentity: [user]\nalgorithm: fixed_window\n"+
		"limit: 10\nperiod: 1m\nscope: region\n",
		func(c *Config) { c.EnvoyLimitHeaders = true })
	heavy := entries("generic_key", "api", "user", "heavy")
	heavy.HitsAddend = wrapperspb.UInt64(7)
	resp := shouldRateLimit(t, client, "edge", entries("generic_key", "api", "user", "light"), heavy)
	h := map[string]string{}
	for _, v := range resp.ResponseHeadersToAdd {
		h[v.Key] = v.Value
	}
	if h["RateLimit-Limit"] != "10" || h["RateLimit-Remaining"] != "3" || h["RateLimit-Reset"] == "" {
		t.Fatalf("headers %v, want the heavy descriptor's: limit 10, remaining 3", h)
	}
}
