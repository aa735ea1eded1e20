package rlqsenvoy

import (
	"errors"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/quotalease"
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
	s := &rlqfv3.RateLimitQuotaBucketSettings{
		ReportingInterval: durationpb.New(reporting),
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{
				FallbackRateLimit: quotalease.StrategyProto(m.NoAssignment),
			},
		},
	}
	if m.Fallback != nil {
		fallback := &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{
			FallbackRateLimit: quotalease.StrategyProto(*m.Fallback),
		}
		s.ExpiredAssignmentBehavior = &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
			ExpiredAssignmentBehaviorTimeout: durationpb.New(m.FallbackFor),
			ExpiredAssignmentBehavior:        fallback,
		}
	}
	if err := ValidateSettings(s); err != nil {
		return nil, err
	}
	return s, nil
}
