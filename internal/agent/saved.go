package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// What a region's agents keep in its Redis so that an agent can start, or
// a region scale out, while the coordinator is unreachable:
//
//	ql:policies:{<region>}  the policy set last loaded from the coordinator (JSON)
//	ql:grants:{<region>}    hash: quota -> the grant an agent of the region
//	                        last installed (savedGrant, JSON)
//
// Both are written by every instance (last writer wins: any instance's
// grant is at most what the coordinator counts for the region, and ends no
// later). Times are wall-clock Unix milliseconds, the only clock two
// processes share; a restoring agent subtracts Config.SavedClockSkew from
// every remaining time, so a wall clock off by up to that much between the
// hosts of a region (NTP keeps them within milliseconds) never lengthens a
// grant or a degraded period.
func savedPoliciesKey(region string) string { return "ql:policies:{" + region + "}" }
func savedGrantsKey(region string) string   { return "ql:grants:{" + region + "}" }

// savedTTL is how long a region's saved state outlives its last write: a
// region whose agents are all gone for longer starts as a new one.
const savedTTL = 7 * 24 * time.Hour

// savedGrant is one quota's grant as kept in Redis.
type savedGrant struct {
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

// writeSavedPolicies writes ps as the region's saved policy set.
func writeSavedPolicies(ctx context.Context, rdb redis.UniversalClient, region string, ps []*policy.Policy) error {
	b, err := json.Marshal(ps)
	if err != nil {
		return fmt.Errorf("save policies: %w", err)
	}
	if err := rdb.Set(ctx, savedPoliciesKey(region), b, savedTTL).Err(); err != nil {
		return fmt.Errorf("save policies: %w", err)
	}
	return nil
}

// loadSavedPolicies reads the region's saved policy set; ok is false when
// there is none.
func loadSavedPolicies(ctx context.Context, rdb redis.UniversalClient, region string) (ps []*policy.Policy, ok bool, err error) {
	b, err := rdb.Get(ctx, savedPoliciesKey(region)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read saved policies: %w", err)
	}
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, false, fmt.Errorf("saved policies in %s: %w", savedPoliciesKey(region), err)
	}
	return ps, true, nil
}

// saveGrants writes this process's grants that changed since the last
// call (all of them on the first). With prune it also drops saved grants
// of quotas no longer leased.
func (l *leaser) saveGrants(ctx context.Context, rdb redis.UniversalClient, prune bool) error {
	now := l.now()
	l.mu.Lock()
	var fields []any
	written := map[*quotaLease]lease.Grant{}
	for n, q := range l.quotas {
		if !q.a.Own() {
			continue
		}
		g, until := q.a.Grant()
		if q.savedID == g.ID {
			continue
		}
		b, _ := json.Marshal(savedGrant{ID: g.ID, Amount: g.Amount, Identities: g.Identities, Total: g.Total, ValidUntilMs: now.Add(until.Sub(now)).UnixMilli(),
			DegradedTimeoutMs: q.a.DegradedTimeout().Milliseconds(), Fingerprint: q.fp})
		fields = append(fields, n, string(b))
		q.savedID = g.ID
		written[q] = g
	}
	keep := make(map[string]bool, len(l.quotas))
	for n := range l.quotas {
		keep[n] = true
	}
	l.mu.Unlock()
	key := savedGrantsKey(l.region)
	pipe := rdb.Pipeline()
	if len(fields) > 0 {
		pipe.HSet(ctx, key, fields...)
		pipe.PExpire(ctx, key, savedTTL)
	}
	var all *redis.StringSliceCmd
	if prune {
		all = pipe.HKeys(ctx, key)
	}
	if pipe.Len() == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		l.forgetSaved() // write them all again next time
		return fmt.Errorf("save grants: %w", err)
	}
	l.mu.Lock()
	for q, g := range written {
		q.durable = g // now it may be acknowledged (leaser.renew)
	}
	l.mu.Unlock()
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
		if err := rdb.HDel(ctx, key, gone...).Err(); err != nil {
			return fmt.Errorf("drop saved grants: %w", err)
		}
	}
	return nil
}

// forgetSaved makes the next saveGrants write every grant.
func (l *leaser) forgetSaved() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.quotas {
		q.savedID = ""
	}
}

// restoreGrants installs the region's saved grants in every quota this
// process holds no grant of its own for, and reports how many it
// installed. A grant saved for another version of the policy is skipped.
// Called again every presence round while such quotas remain, it follows
// the grants the region's other instances install.
func (l *leaser) restoreGrants(ctx context.Context, rdb redis.UniversalClient, skew time.Duration) (int, error) {
	l.mu.Lock()
	var names []string
	for n, q := range l.quotas {
		if !q.a.Own() {
			names = append(names, n)
		}
	}
	l.mu.Unlock()
	if len(names) == 0 {
		return 0, nil
	}
	vals, err := rdb.HMGet(ctx, savedGrantsKey(l.region), names...).Result()
	if err != nil {
		return 0, fmt.Errorf("read saved grants: %w", err)
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		var g savedGrant
		if json.Unmarshal([]byte(s), &g) != nil || g.Amount < 0 || g.ID == "" {
			continue
		}
		q := l.quotas[names[i]]
		if q == nil || q.fp != g.Fingerprint || q.a.Own() {
			continue
		}
		left := time.Duration(g.ValidUntilMs-now.UnixMilli())*time.Millisecond - skew
		q.a.SetDegradedTimeout(time.Duration(g.DegradedTimeoutMs) * time.Millisecond)
		q.a.Restore(lease.Grant{ID: g.ID, Amount: g.Amount, Identities: g.Identities, Total: g.Total}, now.Add(left))
		n++
	}
	return n, nil
}

// restorePolicies installs the region's saved policy set when the agent
// keeps its policies in Redis (Config.KeepPolicies) and reports whether it
// did. Run calls it before asking the coordinator, so a start during an
// outage serves at once; the coordinator's set replaces it when it comes.
func (a *Agent) restorePolicies(ctx context.Context) bool {
	if !a.cfg.KeepPolicies {
		return false
	}
	ps, ok, err := loadSavedPolicies(ctx, a.cfg.Redis, a.cfg.Region)
	switch {
	case err != nil:
		a.cfg.Logger.Warn("the region's saved policies are not readable; asking the coordinator", "error", err)
		return false
	case !ok:
		return false
	}
	if err := a.installPolicies(ps); err != nil {
		a.cfg.Logger.Warn("the region's saved policies are refused; asking the coordinator", "error", err)
		return false
	}
	a.savedFP = policySetFingerprint(ps)
	a.cfg.Logger.Info("started from the region's saved policies; the coordinator's replace them when it answers", "policies", len(ps))
	return true
}

// restoreGrants installs the region's saved grants (leaser.restoreGrants);
// at start it logs what each global policy starts from.
func (a *Agent) restoreGrants(ctx context.Context, atStart bool) {
	n, err := a.leaser.restoreGrants(ctx, a.cfg.Redis, a.cfg.SavedClockSkew)
	if err != nil {
		if atStart {
			a.cfg.Logger.Warn("the region's saved grants are not readable", "error", err)
		}
		return
	}
	if atStart && n > 0 {
		a.cfg.Logger.Info("restored the region's saved grants: enforcing each until it ends, then its degraded budget, until the coordinator grants anew",
			"grants", n, "global_policies", len(a.leaser.names()))
	}
}

// savePolicies saves ps as the region's policy set when it differs from
// the set last saved.
func (a *Agent) savePolicies(ctx context.Context, ps []*policy.Policy) {
	fp := policySetFingerprint(ps)
	if fp == a.savedFP {
		return
	}
	if err := writeSavedPolicies(ctx, a.cfg.Redis, a.cfg.Region, ps); err != nil {
		a.cfg.Logger.Debug("policies not saved", "error", err)
		return
	}
	a.savedFP = fp
	a.prune.Store(true)
}

// saveState saves this process's changed grants, prunes those of deleted
// policies after a change of the set, and follows the saved grants where
// this process holds none of its own.
func (a *Agent) saveState(ctx context.Context) {
	if err := a.leaser.saveGrants(ctx, a.cfg.Redis, a.prune.Swap(false)); err != nil {
		a.cfg.Logger.Debug("grants not saved", "error", err)
	}
	a.restoreGrants(ctx, false)
}

// policySetFingerprint identifies a policy set by its policies'
// fingerprints, in order.
func policySetFingerprint(ps []*policy.Policy) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, p := range ps {
		binary.LittleEndian.PutUint64(b[:], p.Fingerprint())
		h.Write(b[:])
	}
	return h.Sum64()
}
