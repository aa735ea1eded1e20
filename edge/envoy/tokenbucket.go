package envoy

import (
	"math"
	"time"
)

// minFillRate is AtomicTokenBucketImpl's floor on the fill rate: one
// token a year (token_bucket_impl.cc, kMinFillRate).
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// limiter is Envoy's AtomicTokenBucketImpl as the filter builds it
// (createTokenBucketFromAction): a continuous refill at rate tokens a
// second up to max, kept as the instant (seconds of the monotonic clock)
// at which the bucket was last empty.
type limiter struct {
	cfg   TokenBucketConfig // the assignment it was built from, for sameConfig
	max   float64
	rate  float64 // tokens per second; +Inf when the fill interval is under 1 s
	empty float64 // the instant the bucket held no tokens
}

// Rate is the tokens a second Envoy refills a bucket of c with
// (createTokenBucketFromAction): tokens_per_fill over the fill interval
// truncated to whole seconds, +Inf under one second, and at least one
// token a year.
func (c TokenBucketConfig) Rate() float64 {
	secs := int64(c.FillInterval / time.Second)
	if secs <= 0 {
		return math.Inf(1)
	}
	return math.Max(float64(c.TokensPerFill)/float64(secs), minFillRate)
}

// newLimiter builds the limiter for c at now (seconds). With no previous
// limiter it starts full; replacing prev it starts at prev's fill ratio of
// the new max_tokens, truncated to a whole token (PR #37624).
func newLimiter(c TokenBucketConfig, now float64, prev *limiter) *limiter {
	initial := uint64(c.MaxTokens)
	if prev != nil {
		initial = prev.share(now, uint64(c.MaxTokens))
	}
	l := &limiter{cfg: c, max: float64(c.MaxTokens), rate: c.Rate(), empty: now}
	if initial != 0 && !math.IsInf(l.rate, 1) {
		l.empty = now - float64(initial)/l.rate
	}
	return l
}

// tokens is remainingTokens(): what the bucket holds at now.
func (l *limiter) tokens(now float64) float64 {
	if math.IsInf(l.rate, 1) {
		return l.max
	}
	return math.Max(0, math.Min(l.max, (now-l.empty)*l.rate))
}

// share is the new bucket's initial tokens when this one is replaced:
// max_tokens × remaining / max, truncated. Envoy divides by zero when the
// old max is 0 (undefined); that reads as an empty start here.
func (l *limiter) share(now float64, newMax uint64) uint64 {
	if l.max == 0 {
		return 0
	}
	return uint64(float64(newMax) * (l.tokens(now) / l.max))
}

// consume takes n tokens if the bucket holds them (consume(n, false)).
func (l *limiter) consume(now, n float64) bool {
	total := l.tokens(now)
	if total < n {
		return false
	}
	if !math.IsInf(l.rate, 1) {
		l.empty = now - (total-n)/l.rate
	}
	return true
}
