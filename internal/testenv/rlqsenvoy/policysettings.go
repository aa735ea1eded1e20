package rlqsenvoy

import (
	"errors"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/policy"
)

// SettingsFor are the RateLimitQuotaBucketSettings of an Envoy configured
// as the policy's edge settings say it is (envoy.SettingsOf, the one
// mapping; docs/rlqs.md, "When Envoy holds no assignment"), as Envoy's
// filter configuration carries them. The bound's edge term counts what
// the policy states, so tests run Envoy-like clients configured this way.
// reporting is the settings' reporting_interval (required by Envoy's
// validation, ignored by Envoy and by this client).
func SettingsFor(e *policy.Edge, reporting time.Duration) (*rlqfv3.RateLimitQuotaBucketSettings, error) {
	if e == nil {
		return nil, errors.New("bucket settings: the policy has no edge settings")
	}
	m := envoy.SettingsOf(e)
	s := &rlqfv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(reporting),
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: strategyProto(m.NoAssignment)}}}
	if m.Fallback != nil {
		s.ExpiredAssignmentBehavior = &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(m.FallbackFor),
			ExpiredAssignmentBehavior:        &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: strategyProto(*m.Fallback)}}
	}
	if err := ValidateSettings(s); err != nil {
		return nil, err
	}
	return s, nil
}

// strategyProto is s as a rate_limit_strategy (the inverse of strategy;
// Unsupported, which no policy states, is an unset strategy).
func strategyProto(s envoy.Strategy) *typev3.RateLimitStrategy {
	switch s.Kind {
	case envoy.AllowAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	case envoy.DenyAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	case envoy.TokenBucket:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: s.Bucket.MaxTokens, TokensPerFill: wrapperspb.UInt32(s.Bucket.TokensPerFill), FillInterval: durationpb.New(s.Bucket.FillInterval)}}}
	default:
		return &typev3.RateLimitStrategy{}
	}
}
