package regional

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/quota-lease/quota-lease/policy"
)

// Key layout. Every key of one (policy, identity) pair shares the hash tag
// {<policy>:<identity>}, so on Redis Cluster they live in one slot and a
// script may touch all of them:
//
//	rl:{<policy>:<identity>}:v<version>          state (hash, or sorted set for sliding_log)
//	rl:{<policy>:<identity>}:v<version>:m        sliding_log metadata
//	rl:{<policy>:<identity>}:v<version>:i:<key>  a remembered idempotent decision (a reservation's: its record)
//	rl:{<policy>:<identity>}:v<version>:r:<key>  a remembered return
//	rl:{<policy>:<identity>}:v<version>:s:<key>  a remembered settlement of reservation <key>
//
// A policy with shards (policy.Policy.Shards) keeps shard 0 of an identity
// under these keys and shard k > 0 under {<policy>:<identity>#<k>}: its own
// hash tag, so its own slot. '#' never occurs in an identity (IdentityOf
// escapes it), so no identity's keys collide with another's shard.
//
// and one key per store, its birth marker (BornKey, see policy.Fresh and
// Engine.InitStore); on Redis Cluster one per hash slot (SlotBornKey).
//
// The identity is policy.Policy.IdentityOf's, escaped so that it cannot
// break the hash tag. A new config version starts fresh keys; the old ones
// expire after their TTL.
const keyPrefix = "rl:"

// BornKey is the store's birth marker: when the store's memory began, in
// enforcement ms, or 0 for a store its agent found new. It has no TTL; a
// store that loses it has lost everything else too. On Redis Cluster each
// slot has one of its own (SlotBornKey).
const BornKey = keyPrefix + "born"

// MaxKeyBytes bounds a whole state key.
const MaxKeyBytes = 1024

// StateKey returns the Redis key of identity (IdentityOf's) under p; for a
// policy with shards, of the identity's shard 0.
func StateKey(p *policy.Policy, identity string) (string, error) {
	return ShardKey(p, identity, 0)
}

// ShardKey returns the Redis key of shard shard of identity under p.
func ShardKey(p *policy.Policy, identity string, shard int64) (string, error) {
	tag := p.Name + ":" + identity
	if shard > 0 {
		tag += "#" + strconv.FormatInt(shard, 10)
	}
	k := keyPrefix + "{" + tag + "}:v" + strconv.FormatInt(p.Version, 10)
	if len(k) > MaxKeyBytes {
		return "", fmt.Errorf("%w: key for policy %q would be %d bytes, more than %d",
			policy.ErrInvalidIdentity, p.Name, len(k), MaxKeyBytes)
	}
	return k, nil
}

// idempotencyKey returns the key remembering a decision for idem, a valid
// idempotency key (admission.ValidIdempotencyKey).
func idempotencyKey(stateKey, idem string) string {
	var b strings.Builder
	b.WriteString(stateKey)
	b.WriteString(":i:")
	policy.Escape(&b, idem)
	return b.String()
}
