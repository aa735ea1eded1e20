package agent

import (
	"fmt"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"

	"github.com/quota-lease/quota-lease/policy"
)

// A limit override the agent cannot enforce fails the call with
// INVALID_ARGUMENT naming what is wrong, and charges nothing, the other
// descriptors of the call included: a unit that is no Envoy unit (the
// original crashes on it), or a window longer than a day. In a domain
// no configuration loaded, an override is not read, as in the original.
func TestEnvoyBadOverrideChargesNothing(t *testing.T) {
	client := envoyClient(t,
		"domain: ov\nscope: region\ndescriptors:\n"+
			"  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n", nil)
	for _, c := range []struct {
		unit typev3.RateLimitUnit
		want string
	}{{typev3.RateLimitUnit_UNKNOWN, "unit UNKNOWN"}, {99, "unit 99"}, {typev3.RateLimitUnit_MONTH, "period 720h0m0s"}} {
		wantRefused(t, client, fmt.Sprintf("override unit %v", c.unit), codes.InvalidArgument, c.want,
			"ov", entries("user", "u"), withOverride(entries("user", "v"), 1, c.unit))
	}
	resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "ov", Descriptors: d(entries("user", "u"), entries("user", "v"))})
	if err != nil || resp.Statuses[0].LimitRemaining != 4 || resp.Statuses[1].LimitRemaining != 4 {
		t.Fatalf("after the refused calls: %v %v, want 4 of 5 left for both (nothing charged)", resp, err)
	}
	resp, err = client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "elsewhere",
		Descriptors: []*commonrl.RateLimitDescriptor{withOverride(entries("user", "u"), 1, typev3.RateLimitUnit_UNKNOWN)}})
	if err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("override in an unknown domain: %v %v, want OK with no limit", resp, err)
	}
}

// An override of a descriptor whose configured limit is global (leased)
// is global too: the region enforces the fraction of it its lease gives
// it of the configured limit, so the regions together never admit more
// than the override; with the configured limit's unit it counts in that
// limit's counter, as in the original.
func TestEnvoyOverrideOfGlobalLimit(t *testing.T) {
	// post_hoc: false: the refused override call that ends the loop is not
	// counted, so the configured limit has counted exactly the admitted ones.
	ra := regionAgent(t, "domain: og\npost_hoc: false\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n", nil)
	client := rlsv3.NewRateLimitServiceClient(grpcConn(t, ra.grpcAddr))
	call := func(ds ...*commonrl.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		return shouldRateLimit(t, client, "og", ds...).Statuses[0]
	}
	waitLeased(t, ra.a, "og.user", 10*time.Second)
	// The override of a global limit is global too: the region enforces
	// its lease's fraction of it, so never more than 30 an hour.
	oks := 0
	for i := 0; ; i++ {
		st := call(withOverride(entries("user", "u"), 30, typev3.RateLimitUnit_HOUR))
		if st.CurrentLimit.GetRequestsPerUnit() > 30 || st.CurrentLimit.GetName() != "" {
			t.Fatalf("override call %d: %v, want at most 30 per hour, unnamed", i, st)
		}
		if st.Code != ok {
			break
		}
		if oks++; oks > 30 {
			t.Fatalf("override of 30 per hour admitted %d", oks)
		}
	}
	amount, _ := ra.a.leaser.Enforce("og.user", "user=u", time.Now())
	if most := 30 * amount / (1000 * policy.Micro); int64(oks) > most+1 {
		t.Fatalf("the override admitted %d of its 30 an hour, the region's share of them is %d", oks, most)
	}
	// The configured limit is the region's share (however much the lease
	// gives now): it has counted the override's 2 hits.
	st := call(entries("user", "u"))
	if limit := int64(st.CurrentLimit.GetRequestsPerUnit()); st.Code != ok || int64(st.LimitRemaining) > limit-int64(oks)-1 {
		t.Fatalf("the configured limit after the override's %d hits: %v, want OK with at most %d left (the override's hits counted)", oks, st, limit-int64(oks)-1)
	}
}
