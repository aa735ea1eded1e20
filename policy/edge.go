package policy

import (
	"fmt"
	"math"
	"time"
)

// Edge says how a policy is enforced at the edge: by Envoy instances that
// get token-bucket assignments from the agent, Envoy's Rate Limit Quota
// Service (docs/rlqs.md). It states what Envoy is configured to do when it
// holds no assignment, which the agent cannot change and the bound must
// count, and how many Envoy instances a region runs. A policy without it
// gets no assignments.
type Edge struct {
	// Instances is the most Envoy instances per region that report the
	// policy's buckets: each runs its fallback on its own (the bound's
	// edge term). More get no assignment (the region's instance places,
	// edge/places.go), and keep the no_assignment behaviour.
	Instances int `yaml:"instances" json:"instances"`
	// NoAssignment is Envoy's no_assignment_behavior (a blanket rule):
	// deny (DENY_ALL) or allow (ALLOW_ALL, Envoy's default: the edge is
	// then unbounded until assignments arrive). Required.
	NoAssignment EdgeRule `yaml:"no_assignment" json:"no_assignment"`
	// Expired is Envoy's expired_assignment_behavior: what a bucket does
	// once its assignment's time to live ran out. Unset: what NoAssignment
	// says (Envoy reverts to it).
	Expired EdgeExpired `yaml:"expired,omitempty" json:"expired,omitempty"`
	// TTL is the time to live of assignments, whole seconds from 1s to
	// MaxEdgeTTL (Envoy reads whole seconds only); shorter when the
	// region's grant ends sooner. Default DefaultEdgeTTL.
	TTL Duration `yaml:"ttl,omitempty" json:"ttl,omitempty"`
}

// EdgeRule is a blanket rule of Envoy's.
type EdgeRule string

// Envoy's blanket rules, and a token bucket (for Expired only: Envoy
// cannot enforce one as its no_assignment_behavior).
const (
	EdgeDeny        EdgeRule = "deny"
	EdgeAllow       EdgeRule = "allow"
	EdgeTokenBucket EdgeRule = "token_bucket"
)

// EdgeExpired is Envoy's expired_assignment_behavior: deny, allow, or a
// token bucket of MaxTokens refilled at TokensPerSecond for Timeout, after
// which Envoy reverts to its no_assignment_behavior.
type EdgeExpired struct {
	Rule            EdgeRule `yaml:"rule,omitempty" json:"rule,omitempty"`
	MaxTokens       uint32   `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	TokensPerSecond uint32   `yaml:"tokens_per_second,omitempty" json:"tokens_per_second,omitempty"`
	Timeout         Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
}

// Edge defaults and limits.
const (
	DefaultEdgeTTL   = 4 * time.Second
	MaxEdgeTTL       = time.Hour
	MaxEdgeInstances = 100_000
)

// EdgeTTL is the time to live the policy's assignments ask for.
func (e *Edge) EdgeTTL() time.Duration {
	if e.TTL == 0 {
		return DefaultEdgeTTL
	}
	return time.Duration(e.TTL)
}

// ExpiredRule is the rule Envoy follows once an assignment expired.
func (e *Edge) ExpiredRule() EdgeRule {
	if e.Expired.Rule == "" {
		return e.NoAssignment
	}
	return e.Expired.Rule
}

// Unbounded reports whether Envoy admits without limit when it holds no
// assignment (an allow rule): the edge term of the bound is infinite.
func (e *Edge) Unbounded() bool {
	return e.NoAssignment == EdgeAllow || e.ExpiredRule() == EdgeAllow
}

// FallbackWorstCase is the most one Envoy instance admits for one bucket
// in any window of length w without an assignment, in requests: nothing
// under deny; +Inf under allow; under an expired token bucket, what the
// bucket refills in w plus a full bucket for every time it may start in w.
// Envoy starts it when an assignment expires, at most once per second (an
// assignment lives at least 1s), so 1+ceil(w/1s) times; a token bucket
// never serves a bucket's first requests (Envoy cannot: its
// no_assignment_behavior is a blanket rule).
func (e *Edge) FallbackWorstCase(w time.Duration) float64 {
	if e.Unbounded() {
		return math.Inf(1)
	}
	if e.ExpiredRule() != EdgeTokenBucket {
		return 0
	}
	starts := 1 + math.Ceil(w.Seconds())
	return starts*float64(e.Expired.MaxTokens) + float64(e.Expired.TokensPerSecond)*w.Seconds()
}

func (e *Edge) validate() *fieldError {
	if e.Instances < 1 || e.Instances > MaxEdgeInstances {
		return &fieldError{"instances", fmt.Sprintf("must be 1 to %d Envoy instances per region, got %d",
			MaxEdgeInstances, e.Instances)}
	}
	switch e.NoAssignment {
	case EdgeDeny, EdgeAllow:
	case EdgeTokenBucket:
		return &fieldError{"no_assignment",
			"cannot be a token bucket: Envoy enforces only a blanket rule before a bucket's first assignment; use " +
				"deny or allow, and a token bucket under expired"}
	default:
		return &fieldError{"no_assignment", fmt.Sprintf("%s; say what Envoy's no_assignment_behavior is: deny "+
			"or allow", QuoteName(string(e.NoAssignment)))}
	}
	x := e.Expired
	switch x.Rule {
	case "", EdgeDeny, EdgeAllow:
		if x.MaxTokens != 0 || x.TokensPerSecond != 0 || x.Timeout != 0 {
			return &fieldError{"expired", "max_tokens, tokens_per_second and timeout apply only to rule token_bucket"}
		}
	case EdgeTokenBucket:
		if x.MaxTokens < 1 || x.TokensPerSecond < 1 {
			return &fieldError{"expired", fmt.Sprintf("a token bucket needs max_tokens and tokens_per_second of at "+
				"least 1, got %d and %d", x.MaxTokens, x.TokensPerSecond)}
		}
		if d := time.Duration(x.Timeout); d < time.Second || d%time.Second != 0 || d > MaxEdgeTTL {
			return &fieldError{"expired", fmt.Sprintf("timeout must be whole seconds from 1s to %s (Envoy's "+
				"expired_assignment_behavior_timeout), got %s", MaxEdgeTTL, d)}
		}
	default:
		return &fieldError{"expired", fmt.Sprintf("rule %s; use deny, allow or token_bucket", QuoteName(string(x.Rule)))}
	}
	if d := time.Duration(e.TTL); e.TTL != 0 && (d < time.Second || d%time.Second != 0 || d > MaxEdgeTTL) {
		return &fieldError{"ttl", fmt.Sprintf("must be whole seconds from 1s to %s (Envoy reads whole seconds "+
			"of assignment_time_to_live), got %s", MaxEdgeTTL, d)}
	}
	return nil
}
