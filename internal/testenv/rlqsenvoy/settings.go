package rlqsenvoy

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/quotalease"
)

// settings is what Envoy takes from a bucket's matched
// RateLimitQuotaBucketSettings when it creates the bucket (filter.cc,
// recordBucketUsage) and keeps for the bucket's life.
type settings struct {
	// noAssignment is the default action's strategy; nil allows all.
	noAssignment *typev3.RateLimitStrategy
	// fallback is expired_assignment_behavior.fallback_rate_limit; nil
	// when unset or when reuse_last_assignment is set (not implemented
	// by Envoy: the bucket goes straight to its default action).
	fallback *typev3.RateLimitStrategy
	// fallbackFor is expired_assignment_behavior_timeout in whole seconds
	// (0 when unset: the fallback ends as soon as it starts).
	fallbackFor time.Duration
	// denyStatus is the HTTP status of a denial (429 unless
	// deny_response_settings.http_status says otherwise).
	denyStatus int
	// model is the same, as package edge/envoy's buckets read it.
	model envoy.Settings
}

// parseSettings reads s as Envoy does. A nil s is Envoy's behaviour with
// none of the optional settings: allow all until assigned, no expired
// behaviour, 429. s must pass Validate, and its no_assignment_behavior must
// not be a token bucket, which Envoy accepts but then crashes on (the
// default action never gets a limiter; filter.cc shouldAllowRequest).
func parseSettings(s *rlqfv3.RateLimitQuotaBucketSettings) (*settings, error) {
	out := &settings{denyStatus: http.StatusTooManyRequests}
	if s == nil {
		return out, nil
	}
	if err := s.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bucket settings: %w", err)
	}
	if nab := s.GetNoAssignmentBehavior(); nab != nil {
		out.noAssignment = nab.GetFallbackRateLimit()
		if out.noAssignment.GetTokenBucket() != nil {
			return nil, errors.New("bucket settings: a token bucket as no_assignment_behavior crashes Envoy " +
				"(its default action never gets a limiter); use a blanket rule there and a token bucket in " +
				"expired_assignment_behavior")
		}
	}
	if eab := s.GetExpiredAssignmentBehavior(); eab != nil {
		out.fallback = eab.GetFallbackRateLimit()
		out.fallbackFor = time.Duration(max(eab.GetExpiredAssignmentBehaviorTimeout().GetSeconds(), 0)) * time.Second
	}
	if code := s.GetDenyResponseSettings().GetHttpStatus().GetCode(); code != 0 {
		out.denyStatus = int(code)
	}
	out.model = envoy.Settings{FallbackFor: out.fallbackFor}
	if out.noAssignment != nil {
		out.model.NoAssignment = quotalease.StrategyOf(out.noAssignment)
	}
	if out.fallback != nil {
		fb := quotalease.StrategyOf(out.fallback)
		out.model.Fallback = &fb
	}
	return out, nil
}

// ValidateSettings says whether this client (and Envoy) can run with
// bucket settings s: they pass their validation, and no_assignment_behavior
// is not a token bucket, which Envoy accepts and then crashes on.
func ValidateSettings(s *rlqfv3.RateLimitQuotaBucketSettings) error {
	if s == nil {
		return errors.New("bucket settings: none")
	}
	_, err := parseSettings(s)
	return err
}
