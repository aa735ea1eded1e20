package agent

import (
	"strings"
	"testing"
)

// A descriptor over a quota_mode limit is a soft limit (the parity table
// compares its answers with the original's): with the limit headers on,
// they describe it as the original does (0 remaining, its reset from the
// status as decided); quota-lease's retry-after is never added for it, as
// the call is not OVER_LIMIT.
func TestEnvoyQuotaModeHeaders(t *testing.T) {
	client := envoyClient(t,
		"domain: qh\nscope: region\ndescriptors:\n"+
			"  - key: user\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		func(c *Config) { c.EnvoyLimitHeaders, c.EnvoyRetryAfter = true, true })
	for i := range 3 {
		resp := shouldRateLimit(t, client, "qh", entries("user", "u"))
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.Code != ok || st.LimitRemaining != 0 || st.CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Fatalf("call %d: %v, want OK with the limit and 0 remaining", i, resp)
		}
		if over := i > 0; over != (st.DurationUntilReset == nil) {
			t.Fatalf("call %d: duration_until_reset %v, want it only while within the limit", i, st.DurationUntilReset)
		}
		var names []string
		for _, h := range resp.ResponseHeadersToAdd {
			names = append(names, h.Key+"="+h.Value)
			if h.Key == "RateLimit-Reset" && (h.Value == "" || h.Value == "0") {
				t.Fatalf("call %d: reset header %q, want the window's seconds", i, h.Value)
			}
		}
		if got := strings.Join(names, " "); !strings.Contains(got, "RateLimit-Remaining=0") || strings.Contains(got, "retry-after") {
			t.Fatalf("call %d: headers %s, want the limit headers with 0 remaining and no retry-after", i, got)
		}
	}
}
