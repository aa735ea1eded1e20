package rlqsenvoy

import (
	"fmt"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quota-lease/quota-lease/policy"
)

// SettingsFor are the bucket settings of an Envoy configured as the
// policy's edge settings say it is (docs/rlqs.md, "When Envoy holds no
// assignment"): no_assignment_behavior the policy's blanket rule, and
// expired_assignment_behavior its expired rule, if it has one. The bound's
// edge term counts what the policy states, so tests run Envoy-like clients
// configured this way. reporting is the settings' reporting_interval
// (required by Envoy's validation, ignored by Envoy and by this client).
func SettingsFor(e *policy.Edge, reporting time.Duration) (*rlqfv3.RateLimitQuotaBucketSettings, error) {
	if e == nil {
		return nil, fmt.Errorf("no edge settings")
	}
	s := &rlqfv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(reporting)}
	noAssignment, err := blanketRule(e.NoAssignment)
	if err != nil {
		return nil, fmt.Errorf("no_assignment: %w", err)
	}
	s.NoAssignmentBehavior = &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: noAssignment}}
	if x := e.Expired; x.Rule != "" {
		var fallback *typev3.RateLimitStrategy
		timeout := time.Hour // a blanket rule's timeout ends in the no-assignment rule, the same or stricter
		if x.Rule == policy.EdgeTokenBucket {
			fallback = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
				MaxTokens: x.MaxTokens, TokensPerFill: wrapperspb.UInt32(x.TokensPerSecond), FillInterval: durationpb.New(time.Second)}}}
			timeout = time.Duration(x.Timeout)
		} else if fallback, err = blanketRule(x.Rule); err != nil {
			return nil, fmt.Errorf("expired: %w", err)
		}
		s.ExpiredAssignmentBehavior = &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(timeout),
			ExpiredAssignmentBehavior:        &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: fallback}}
	}
	if err := ValidateSettings(s); err != nil {
		return nil, err
	}
	return s, nil
}

// blanketRule is Envoy's blanket rule for a policy's deny or allow.
func blanketRule(r policy.EdgeRule) (*typev3.RateLimitStrategy, error) {
	var rule typev3.RateLimitStrategy_BlanketRule
	switch r {
	case policy.EdgeDeny:
		rule = typev3.RateLimitStrategy_DENY_ALL
	case policy.EdgeAllow:
		rule = typev3.RateLimitStrategy_ALLOW_ALL
	default:
		return nil, fmt.Errorf("rule %q is no blanket rule", r)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, nil
}
