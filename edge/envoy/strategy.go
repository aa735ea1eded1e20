package envoy

import (
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
)

// Kind is the kind of a rate_limit_strategy.
type Kind uint8

// The strategies Envoy knows.
const (
	// AllowAll is blanket_rule ALLOW_ALL.
	AllowAll Kind = iota
	// DenyAll is blanket_rule DENY_ALL.
	DenyAll
	// TokenBucket is token_bucket.
	TokenBucket
	// Unsupported is requests_per_time_unit ("not yet supported") or a
	// strategy with nothing set: ignored as an assignment, allowing all
	// where Envoy enforces it (a default or fallback action).
	Unsupported
)

// Strategy is a rate_limit_strategy. The zero value allows all.
type Strategy struct {
	Kind Kind
	// Bucket is a TokenBucket's max_tokens, tokens_per_fill (0 when unset,
	// as Envoy reads it) and fill_interval.
	Bucket TokenBucketConfig
}

// TokenBucketConfig is a token_bucket as Envoy reads it.
type TokenBucketConfig struct {
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
}

// Assignment is the strategy an agent's assignment b stands for: DENY_ALL
// for a bucket that admits nothing (tokens.Bucket.Deny), else its token
// bucket.
func Assignment(b tokens.Bucket) Strategy {
	if b.Deny() {
		return Strategy{Kind: DenyAll}
	}
	c := TokenBucketConfig{MaxTokens: b.MaxTokens, TokensPerFill: b.TokensPerFill, FillInterval: b.FillInterval}
	return Strategy{Kind: TokenBucket, Bucket: c}
}

// sameConfig is protoTokenBucketsEq: max_tokens, tokens_per_fill and only
// the nanoseconds of fill_interval are compared, so two assignments that
// differ in the seconds of their fill interval alone count as the same and
// the old limiter, with its old rate, is kept.
func sameConfig(a, b TokenBucketConfig) bool {
	return a.MaxTokens == b.MaxTokens && a.TokensPerFill == b.TokensPerFill &&
		a.FillInterval%time.Second == b.FillInterval%time.Second
}

// Settings are what Envoy takes from a bucket's matched
// RateLimitQuotaBucketSettings when it creates the bucket and keeps for
// the bucket's life.
type Settings struct {
	// NoAssignment is no_assignment_behavior's strategy, the default
	// action; the zero value (unset) allows all.
	NoAssignment Strategy
	// Fallback is expired_assignment_behavior.fallback_rate_limit; nil
	// when there is none (or reuse_last_assignment, which Envoy does not
	// implement: the bucket goes straight to its default action).
	Fallback *Strategy
	// FallbackFor is expired_assignment_behavior_timeout, whole seconds (0
	// when unset: the fallback ends as soon as it starts).
	FallbackFor time.Duration
	// StartsFull is Envoy before PR #37624: a token bucket that replaces
	// another starts full instead of at the old one's fill ratio.
	StartsFull bool
}

// Clone is s with its own copy of Fallback.
func (s Settings) Clone() Settings {
	if s.Fallback != nil {
		fb := *s.Fallback
		s.Fallback = &fb
	}
	return s
}

// FirstAllowed is noAssignmentBehaviorShouldAllow: a bucket's first
// request is denied only by a DENY_ALL default action, whatever else it is.
func (s *Settings) FirstAllowed() bool { return s.NoAssignment.Kind != DenyAll }

// wholeSeconds is a timer's duration as Envoy takes it: the whole seconds,
// none when negative.
func wholeSeconds(d time.Duration) time.Duration { return max(0, d.Truncate(time.Second)) }
