package quotalease

import (
	"strconv"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quota-lease/quota-lease/edge/envoy"
)

// bucket is one entry of the client's bucket cache: what it does with
// requests is package edge/envoy's (Envoy's own rules, which the simulator
// plays too); this adds the wire: its BucketId and its report times.
type bucket struct {
	id *rlqsv3.BucketId
	m  *envoy.Bucket
	// used is when the bucket last decided a request; reported when the
	// last report carrying it was built; assignedOnce whether the agent
	// has assigned it since it was created.
	used, reported time.Duration
	assignedOnce   bool
	// fresh: no request decided yet (its first is reported at once); gone:
	// no longer cached (abandoned or forgotten), so a Bucket handle holding
	// it looks the bucket up again.
	fresh, gone bool
}

func newBucket(id *rlqsv3.BucketId, set *envoy.Settings, now time.Duration) *bucket {
	return &bucket{id: id, m: envoy.New(set, now), used: now, reported: now, fresh: true}
}

// assign applies a quota assignment received at now and says whether it
// was applied. requests_per_time_unit and an unset strategy are ignored:
// the bucket keeps its action and its deadline.
func (b *bucket) assign(qa *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction, now time.Duration) bool {
	return b.m.Assign(StrategyOf(qa.GetRateLimitStrategy()), qa.GetAssignmentTimeToLive().AsDuration(), now)
}

// usage is one bucket's part of a report, taken under the client's lock
// and written out (proto) after it.
type usage struct {
	key             string
	id              *rlqsv3.BucketId // never changed once the bucket exists
	allowed, denied uint64
	elapsed         time.Duration
}

// take is the counts of b since the last report, then reset, and the time
// since it, at now (Envoy's getUsageFromBucket). With exact, the time
// since the last report is sent to the nanosecond (the agent then reads
// the rate from it rather than from when reports reach it, which the
// network and its own load shift); else in whole seconds, as Envoy does.
func (b *bucket) take(now time.Duration, exact bool) usage {
	allowed, denied, elapsed := b.m.Usage(now)
	if exact {
		elapsed = now - b.reported
	}
	b.reported = now
	return usage{id: b.id, allowed: allowed, denied: denied, elapsed: elapsed}
}

func (u usage) proto() *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId:           proto.Clone(u.id).(*rlqsv3.BucketId),
		TimeElapsed:        durationpb.New(u.elapsed),
		NumRequestsAllowed: u.allowed,
		NumRequestsDenied:  u.denied,
	}
}

// StrategyOf is the rate_limit_strategy s as Envoy reads it:
// requests_per_time_unit and an unset strategy are Unsupported; a token
// bucket's unset tokens_per_fill is 0.
func StrategyOf(s *typev3.RateLimitStrategy) envoy.Strategy {
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

// StrategyProto is s as a rate_limit_strategy, the inverse of StrategyOf
// (Unsupported is an unset strategy): how an agent sends an assignment,
// and a policy's edge settings become Envoy's bucket settings.
func StrategyProto(s envoy.Strategy) *typev3.RateLimitStrategy {
	switch s.Kind {
	case envoy.AllowAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{
			BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL,
		}}
	case envoy.DenyAll:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{
			BlanketRule: typev3.RateLimitStrategy_DENY_ALL,
		}}
	case envoy.TokenBucket:
		return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: s.Bucket.MaxTokens, TokensPerFill: wrapperspb.UInt32(s.Bucket.TokensPerFill),
			FillInterval: durationpb.New(s.Bucket.FillInterval)}}}
	default:
		return &typev3.RateLimitStrategy{}
	}
}

// Key is a BucketId map's identity: Envoy hashes the proto
// (MessageUtil::hash), for which key order does not matter; here the
// sorted pairs, each string prefixed by its length and a colon
// ("6:policy3:api6:tenant4:acme"), readable in the agent's logs.
func Key(bucket map[string]string) string { return string(appendKey(nil, bucket)) }

// appendKey appends bucket's Key to dst, without allocating for buckets
// of up to eight entries when dst has room.
func appendKey(dst []byte, bucket map[string]string) []byte {
	var small [8][2]string
	pairs := small[:0]
	for k, v := range bucket {
		pairs = append(pairs, [2]string{k, v})
	}
	for i := 1; i < len(pairs); i++ { // insertion sort: a handful of entries
		for j := i; j > 0 && pairs[j][0] < pairs[j-1][0]; j-- {
			pairs[j], pairs[j-1] = pairs[j-1], pairs[j]
		}
	}
	for _, p := range pairs {
		for _, s := range p {
			dst = strconv.AppendInt(dst, int64(len(s)), 10)
			dst = append(dst, ':')
			dst = append(dst, s...)
		}
	}
	return dst
}
