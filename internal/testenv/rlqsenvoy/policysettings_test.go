package rlqsenvoy

import (
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/quota-lease/quota-lease/policy"
)

// SettingsFor configures Envoy as a policy's edge settings state it: the
// no-assignment rule, and the expired rule with its token bucket and
// timeout; the settings pass Envoy's validation.
func TestSettingsFor(t *testing.T) {
	deny, err := SettingsFor(&policy.Edge{Instances: 1, NoAssignment: policy.EdgeDeny}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r := deny.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule(); r != typev3.RateLimitStrategy_DENY_ALL || deny.GetExpiredAssignmentBehavior() != nil {
		t.Fatalf("deny: %v", deny)
	}
	tb, err := SettingsFor(&policy.Edge{Instances: 1, NoAssignment: policy.EdgeDeny,
		Expired: policy.EdgeExpired{Rule: policy.EdgeTokenBucket, MaxTokens: 3, TokensPerSecond: 2, Timeout: policy.Duration(7 * time.Second)}}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	eab := tb.GetExpiredAssignmentBehavior()
	b := eab.GetFallbackRateLimit().GetTokenBucket()
	if b.GetMaxTokens() != 3 || b.GetTokensPerFill().GetValue() != 2 || b.GetFillInterval().AsDuration() != time.Second ||
		eab.GetExpiredAssignmentBehaviorTimeout().AsDuration() != 7*time.Second {
		t.Fatalf("token bucket: %v", eab)
	}
	allow, err := SettingsFor(&policy.Edge{Instances: 1, NoAssignment: policy.EdgeAllow, Expired: policy.EdgeExpired{Rule: policy.EdgeDeny}}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if allow.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL ||
		allow.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("allow, expired deny: %v", allow)
	}
	if _, err := SettingsFor(&policy.Edge{Instances: 1, NoAssignment: policy.EdgeTokenBucket}, time.Second); err == nil {
		t.Fatal("a token bucket as the no-assignment rule was accepted")
	}
	if _, err := SettingsFor(nil, time.Second); err == nil {
		t.Fatal("no edge settings were accepted")
	}
}
