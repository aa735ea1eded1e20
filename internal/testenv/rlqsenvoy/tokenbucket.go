package rlqsenvoy

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// minFillRate is AtomicTokenBucketImpl's floor on the fill rate: one
// token a year (token_bucket_impl.cc, kMinFillRate).
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// tokenBucket is Envoy's AtomicTokenBucketImpl as the RLQS filter builds
// it (global_client_impl.cc, createTokenBucketFromAction): a continuous
// refill at rate tokens a second up to max, kept as the instant (in
// seconds of the monotonic clock) at which the bucket was last empty.
type tokenBucket struct {
	cfg   *typev3.TokenBucket // the assignment it was built from, for sameConfig
	max   float64
	rate  float64 // tokens per second; +Inf when the fill interval is under 1 s
	empty float64 // the instant the bucket held no tokens
}

// fillRate is createTokenBucketFromAction's rate: tokens_per_fill over
// the fill interval truncated to whole seconds (absl::ToInt64Seconds).
// Under one second that is a division by zero, which in Envoy's doubles is
// an infinite (or NaN) rate: the bucket is always full. An unset
// tokens_per_fill reads as 0, clamped to the one-token-a-year floor.
func fillRate(cfg *typev3.TokenBucket) float64 {
	secs := int64(cfg.GetFillInterval().AsDuration() / time.Second)
	if secs <= 0 {
		return math.Inf(1)
	}
	return math.Max(math.Abs(float64(cfg.GetTokensPerFill().GetValue())/float64(secs)), minFillRate)
}

// newTokenBucket builds the limiter for cfg at now (seconds). With no
// previous limiter it starts full; replacing prev it starts at prev's fill
// ratio of the new max_tokens, truncated to a whole token (PR #37624).
func newTokenBucket(cfg *typev3.TokenBucket, now float64, prev *tokenBucket) *tokenBucket {
	maxTokens := uint64(cfg.GetMaxTokens())
	initial := maxTokens
	if prev != nil {
		initial = prev.share(now, maxTokens)
	}
	b := &tokenBucket{cfg: cfg, max: float64(maxTokens), rate: fillRate(cfg), empty: now}
	if initial != 0 && !math.IsInf(b.rate, 1) {
		b.empty = now - float64(initial)/b.rate
	}
	return b
}

// tokens is remainingTokens(): what the bucket holds at now.
func (b *tokenBucket) tokens(now float64) float64 {
	if math.IsInf(b.rate, 1) {
		return b.max
	}
	return math.Max(0, math.Min(b.max, (now-b.empty)*b.rate))
}

// share is the new bucket's initial tokens when this one is replaced:
// max_tokens × remaining / max, truncated. Envoy divides by zero when the
// old max is 0 (undefined); that reads as an empty start here.
func (b *tokenBucket) share(now float64, newMax uint64) uint64 {
	if b.max == 0 {
		return 0
	}
	return uint64(float64(newMax) * (b.tokens(now) / b.max))
}

// consume takes one token if there is one (consume(1, false)).
func (b *tokenBucket) consume(now float64) bool {
	total := b.tokens(now)
	if total < 1 {
		return false
	}
	if !math.IsInf(b.rate, 1) {
		b.empty = now - (total-1)/b.rate
	}
	return true
}

// sameConfig is protoTokenBucketsEq: max_tokens, tokens_per_fill and only
// the nanos of fill_interval are compared, so two assignments that differ
// in the seconds of their fill interval alone count as the same and the
// old limiter, with its old rate, is kept.
func sameConfig(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}
