package rlqsenvoy

import (
	"reflect"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/policy"
)

// SettingsFor configures Envoy as a policy's edge settings state it: the
// no-assignment rule, and the expired rule with its token bucket and
// timeout. The settings pass Envoy's validation, and Envoy (this client)
// reads them back as the model the policy maps to (envoy.SettingsOf).
func TestSettingsFor(t *testing.T) {
	for _, c := range []struct {
		edge policy.Edge
		want func(*testing.T, envoy.Settings)
	}{
		{policy.Edge{Instances: 1, NoAssignment: policy.EdgeDeny}, func(t *testing.T, m envoy.Settings) {
			if m.NoAssignment.Kind != envoy.DenyAll || m.Fallback != nil {
				t.Errorf("deny: %+v", m)
			}
		}},
		{policy.Edge{Instances: 1, NoAssignment: policy.EdgeDeny,
			Expired: policy.EdgeExpired{Rule: policy.EdgeTokenBucket, MaxTokens: 3, TokensPerSecond: 2, Timeout: policy.Duration(7 * time.Second)}},
			func(t *testing.T, m envoy.Settings) {
				if m.Fallback == nil || m.Fallback.Bucket != (envoy.TokenBucketConfig{MaxTokens: 3, TokensPerFill: 2, FillInterval: time.Second}) || m.FallbackFor != 7*time.Second {
					t.Errorf("token bucket: %+v", m)
				}
			}},
		{policy.Edge{Instances: 1, NoAssignment: policy.EdgeAllow, Expired: policy.EdgeExpired{Rule: policy.EdgeDeny}}, func(t *testing.T, m envoy.Settings) {
			if m.NoAssignment.Kind != envoy.AllowAll || m.Fallback == nil || m.Fallback.Kind != envoy.DenyAll {
				t.Errorf("allow, expired deny: %+v", m)
			}
		}},
	} {
		s, err := SettingsFor(&c.edge, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		set, err := parseSettings(s)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(set.model, envoy.SettingsOf(&c.edge)) {
			t.Errorf("%+v: read back as %+v, the policy maps to %+v", c.edge, set.model, envoy.SettingsOf(&c.edge))
		}
		c.want(t, set.model)
	}
	deny, _ := SettingsFor(&policy.Edge{Instances: 1, NoAssignment: policy.EdgeDeny}, time.Second)
	if deny.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("deny on the wire: %v", deny)
	}
	if _, err := SettingsFor(nil, time.Second); err == nil {
		t.Fatal("no edge settings were accepted")
	}
}
