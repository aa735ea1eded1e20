package regional

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/policy"
)

// A region's agents save the policy set and the grants they hold, so that
// an agent can start, or the region scale out, while the coordinator is
// unreachable. Every process writes both (last writer wins: any process's
// grant is at most what the coordinator counts for the region, and ends no
// later).

// SavedGrant is one quota's grant as a region keeps it.
type SavedGrant struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	// Identities are the grant's identity shares: a restored grant must
	// enforce them, not the default, for the identities it names.
	Identities map[string]int64 `json:"identities,omitempty"`
	// Total is the grant's lease.Grant.Total.
	Total int64 `json:"total,omitempty"`
	// ValidUntilMs is when the agent stops trusting the grant (its
	// AgentValidFor end), wall clock.
	ValidUntilMs int64 `json:"valid_until_ms"`
	// DegradedTimeoutMs is how long after the grant's end the coordinator
	// reserves its degraded budget (the restoring agent takes drift off).
	DegradedTimeoutMs int64 `json:"degraded_timeout_ms"`
	// Fingerprint of the policy the grant was computed from: a grant of
	// another policy is not restored.
	Fingerprint uint64 `json:"fingerprint"`
}

// SavePolicies saves ps as the region's policy set.
func (r *Region) SavePolicies(ctx context.Context, ps []*policy.Policy) error {
	b, err := json.Marshal(ps)
	if err != nil {
		return fmt.Errorf("save policies: %w", err)
	}
	if err := r.rdb.Set(ctx, r.Key("policies"), b, savedTTL).Err(); err != nil {
		return fmt.Errorf("save policies: %w", err)
	}
	return nil
}

// LoadPolicies reads the region's saved policy set; ok is false when there
// is none.
func (r *Region) LoadPolicies(ctx context.Context) (ps []*policy.Policy, ok bool, err error) {
	b, err := r.rdb.Get(ctx, r.Key("policies")).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read saved policies: %w", err)
	}
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, false, fmt.Errorf("saved policies in %s: %w", r.Key("policies"), err)
	}
	return ps, true, nil
}

// SaveGrants saves grants by quota. With keep, it also drops the saved
// grants of every quota keep does not name.
func (r *Region) SaveGrants(ctx context.Context, grants map[string]SavedGrant, keep map[string]bool) error {
	key := r.Key("grants")
	pipe := r.rdb.Pipeline()
	if len(grants) > 0 {
		fields := make([]any, 0, 2*len(grants))
		for q, g := range grants {
			b, err := json.Marshal(g)
			if err != nil {
				return fmt.Errorf("save grants: %w", err)
			}
			fields = append(fields, q, string(b))
		}
		pipe.HSet(ctx, key, fields...)
		pipe.PExpire(ctx, key, savedTTL)
	}
	var all *redis.StringSliceCmd
	if keep != nil {
		all = pipe.HKeys(ctx, key)
	}
	if pipe.Len() == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("save grants: %w", err)
	}
	if all == nil {
		return nil
	}
	var gone []string
	for _, f := range all.Val() {
		if !keep[f] {
			gone = append(gone, f)
		}
	}
	if len(gone) > 0 {
		if err := r.rdb.HDel(ctx, key, gone...).Err(); err != nil {
			return fmt.Errorf("drop saved grants: %w", err)
		}
	}
	return nil
}

// LoadGrants reads the saved grants of quotas; a quota with none, or with
// one not readable as a grant, is left out.
func (r *Region) LoadGrants(ctx context.Context, quotas []string) (map[string]SavedGrant, error) {
	if len(quotas) == 0 {
		return nil, nil
	}
	vals, err := r.rdb.HMGet(ctx, r.Key("grants"), quotas...).Result()
	if err != nil {
		return nil, fmt.Errorf("read saved grants: %w", err)
	}
	out := make(map[string]SavedGrant, len(vals))
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var g SavedGrant
		if json.Unmarshal([]byte(s), &g) != nil || g.Amount < 0 || g.ID == "" {
			continue
		}
		out[quotas[i]] = g
	}
	return out, nil
}
