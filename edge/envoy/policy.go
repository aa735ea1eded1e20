package envoy

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// SettingsOf is the bucket settings a policy's edge settings state
// (docs/rlqs.md, "When Envoy holds no assignment"): its no-assignment
// rule; its expired rule as the fallback (a token bucket of MaxTokens
// refilled TokensPerSecond every second for Timeout, or a blanket rule,
// for which the policy states no timeout: it lasts until the next
// assignment); none when unset, so that an expired bucket reverts to the
// no-assignment rule.
func SettingsOf(e *policy.Edge) Settings {
	rule := func(r policy.EdgeRule) Strategy {
		if r == policy.EdgeDeny {
			return Strategy{Kind: DenyAll}
		}
		return Strategy{Kind: AllowAll}
	}
	s := Settings{NoAssignment: rule(e.NoAssignment)}
	switch x := e.Expired; x.Rule {
	case "":
	case policy.EdgeTokenBucket:
		b := TokenBucketConfig{MaxTokens: x.MaxTokens, TokensPerFill: x.TokensPerSecond, FillInterval: time.Second}
		s.Fallback = &Strategy{Kind: TokenBucket, Bucket: b}
		s.FallbackFor = time.Duration(x.Timeout)
	default:
		fb := rule(x.Rule)
		s.Fallback, s.FallbackFor = &fb, policy.MaxEdgeTTL
	}
	return s
}
