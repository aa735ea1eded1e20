package rlqsenvoy

import (
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/edge/envoy"
)

// bucket is one entry of Envoy's bucket cache: what Envoy does with it is
// package edge/envoy's (the simulator plays the same model); this adds the
// wire: its BucketId and the strategies as Envoy received them.
type bucket struct {
	id  *rlqsv3.BucketId
	set *settings
	m   *envoy.Bucket
	// assigned is the last applied assignment's strategy, as received
	// (State shows it while the model's phase is Assigned).
	assigned *typev3.RateLimitStrategy
	// reported is when the last report carrying the bucket was built, and
	// assignedOnce whether the server has assigned it since it was
	// created (for Instance.FirstAssignments).
	reported     time.Duration
	assignedOnce bool
}

func newBucket(id *rlqsv3.BucketId, set *settings, now time.Duration) *bucket {
	return &bucket{id: id, set: set, m: envoy.New(&set.model, now), reported: now}
}

// assign applies a quota assignment received at now (onQuotaResponseImpl)
// and says whether it was applied. requests_per_time_unit and an unset
// strategy are ignored: the bucket keeps its action and its deadline.
func (b *bucket) assign(qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, now time.Duration) bool {
	s := qa.GetRateLimitStrategy()
	if !b.m.Assign(strategy(s), qa.GetAssignmentTimeToLive().AsDuration(), now) {
		return false
	}
	b.assigned = s
	return true
}

// assignNothing applies a BucketAction with neither an assignment nor an
// abandon: Envoy caches it as an action without a strategy, which allows
// all and, its TTL reading as zero, expires at once.
func (b *bucket) assignNothing(now time.Duration) {
	b.m.AssignNothing(now)
	b.assigned = &typev3.RateLimitStrategy{}
}

// state is the bucket's cache entry at now, with its strategy as Envoy
// received it.
func (b *bucket) state(now time.Duration) BucketState {
	st := b.m.State(now)
	out := BucketState{Assigned: st.Phase == envoy.Assigned, Until: st.Until, Tokens: st.Tokens}
	switch st.Phase {
	case envoy.Assigned:
		out.Strategy = b.assigned
	case envoy.Fallback:
		out.Strategy = b.set.fallback
	}
	return out
}

// usage is getUsageFromBucket: the counts since the last report, then
// reset, and the time since it in whole seconds.
func (b *bucket) usage(now time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	allowed, denied, elapsed := b.m.Usage(now)
	b.reported = now
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           proto.Clone(b.id).(*rlqsv3.BucketId),
		TimeElapsed:        &durationpb.Duration{Seconds: int64(elapsed / time.Second)},
		NumRequestsAllowed: allowed,
		NumRequestsDenied:  denied,
	}
}

// strategy is s as Envoy reads it: requests_per_time_unit and an unset
// strategy are Unsupported; a token bucket's unset tokens_per_fill is 0.
func strategy(s *typev3.RateLimitStrategy) envoy.Strategy {
	switch x := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		if x.BlanketRule == typev3.RateLimitStrategy_DENY_ALL {
			return envoy.Strategy{Kind: envoy.DenyAll}
		}
		return envoy.Strategy{Kind: envoy.AllowAll}
	case *typev3.RateLimitStrategy_TokenBucket:
		tb := x.TokenBucket
		return envoy.Strategy{Kind: envoy.TokenBucket, Bucket: envoy.TokenBucketConfig{MaxTokens: tb.GetMaxTokens(),
			TokensPerFill: tb.GetTokensPerFill().GetValue(), FillInterval: tb.GetFillInterval().AsDuration()}}
	default:
		return envoy.Strategy{Kind: envoy.Unsupported}
	}
}
