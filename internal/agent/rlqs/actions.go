package rlqs

import (
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/quotalease"
)

// The bucket actions the agent sends on a stream.

// allowAllTTL is the time to live of ALLOW_ALL for buckets nothing limits.
const allowAllTTL = time.Hour

// assignAction assigns b (DENY_ALL when it is none) for ttl.
func assignAction(id *rlqsv3.BucketId, b tokens.Bucket, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return strategyAction(id, quotalease.StrategyProto(envoy.Assignment(b)), ttl)
}

// allowAllAction assigns ALLOW_ALL for allowAllTTL, to a bucket nothing
// limits.
func allowAllAction(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return strategyAction(id, quotalease.StrategyProto(envoy.Strategy{Kind: envoy.AllowAll}), allowAllTTL)
}

func strategyAction(
	id *rlqsv3.BucketId,
	s *typev3.RateLimitStrategy,
	ttl time.Duration,
) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	a := &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
		AssignmentTimeToLive: durationpb.New(ttl),
		RateLimitStrategy:    s,
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: a},
	}
}

func abandonAction(id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	a := &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: a},
	}
}
