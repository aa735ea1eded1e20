package rlqs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/policy"
)

// An RLQS bucket names what it counts as an Envoy RLS descriptor does
// (envoy.go), its entries being a map instead of a list:
//
//   - in a domain loaded from an envoyproxy/ratelimit configuration, the
//     entries pick the descriptor's limit as checkapi.EnvoyIndex does, taking
//     them in the configuration's order (checkapi.EnvoyIndex.MatchMap); no match,
//     or an unlimited limit, limits nothing;
//   - in any other domain, the entry "policy" (or "generic_key") names a
//     quota-lease policy, and every other entry is one of its identity
//     attributes (named by policy.EnvoyAttribute: remote_address is ip).
//
// Either way a bucket is one policy identity: entries beyond the
// identity's attributes are refused, so that each Envoy instance holds one
// bucket (one fallback) per identity, as the bound's edge term counts.

// Caps on a bucket id, checked before anything else (boundedBucket): the
// agent keeps each bucket id it serves whole (an assignment names it as
// Envoy sent it), so these bound what one stream's buckets hold
// (maxBucketBytes × Config.MaxBucketsPerStream). A value longer than
// policy.MaxAttributeValueBytes counts by its hash (checkapi.EnvoyValue).
const (
	MaxBucketEntries  = 16 // entries of one bucket id
	maxBucketKeyBytes = 128
	maxBucketBytes    = 4096 // keys and values together
)

// errBadBucket refuses a bucket id that cannot name anything.
var errBadBucket = errors.New("invalid bucket id")

// rlqsMatch is what a bucket id names: a policy and the request attributes
// of the identity it counts, or no limit at all (pol nil).
type rlqsMatch struct {
	pol   *policy.Policy
	attrs map[string]string
}

// matchBucket maps bucket b of domain to a policy identity with the
// policies and Envoy index given. An error says why it names none
// (errBadBucket, admission.ErrUnknownPolicy, policy.ErrInvalidIdentity).
func matchBucket(
	ix checkapi.EnvoyIndex,
	policies admission.Policies,
	domain string,
	b map[string]string,
) (rlqsMatch, error) {
	if err := boundedBucket(b); err != nil {
		return rlqsMatch{}, err
	}
	if p, configured := ix.MatchMap(domain, b); configured {
		if p == nil || p.Envoy.Unlimited {
			return rlqsMatch{}, nil
		}
		return rlqsMatch{pol: p, attrs: bucketAttributes(b, "")}, nil
	}
	name, nameKey := b["policy"], "policy"
	if name == "" {
		name, nameKey = b["generic_key"], "generic_key"
	}
	if name == "" {
		return rlqsMatch{}, fmt.Errorf("%w: domain %s is no envoyproxy/ratelimit configuration's, and no entry "+
			"\"policy\" names a policy", errBadBucket, policy.QuoteName(domain))
	}
	p, ok := policies.Policy(name)
	if !ok {
		return rlqsMatch{}, fmt.Errorf("%w %s", admission.ErrUnknownPolicy, policy.QuoteName(name))
	}
	attrs := bucketAttributes(b, nameKey)
	if len(attrs) != len(p.Identity) {
		return rlqsMatch{}, fmt.Errorf("%w: policy %s counts by %s; the bucket's other entries must be exactly "+
			"those", errBadBucket, policy.QuoteName(p.Name), strings.Join(p.Identity, ", "))
	}
	return rlqsMatch{pol: p, attrs: attrs}, nil
}

// boundedBucket refuses a bucket id beyond the caps: no entries or more
// than MaxBucketEntries, a key empty or over maxBucketKeyBytes, more than
// maxBucketBytes in all.
func boundedBucket(b map[string]string) error {
	if len(b) == 0 || len(b) > MaxBucketEntries {
		return fmt.Errorf("%w: %d entries, want 1-%d", errBadBucket, len(b), MaxBucketEntries)
	}
	size := 0
	for k, v := range b {
		if k == "" || len(k) > maxBucketKeyBytes {
			return fmt.Errorf("%w: a key is empty or longer than %d bytes", errBadBucket, maxBucketKeyBytes)
		}
		size += len(k) + len(v)
	}
	if size > maxBucketBytes {
		return fmt.Errorf("%w: %d bytes of keys and values, more than %d", errBadBucket, size, maxBucketBytes)
	}
	return nil
}

// bucketAttributes are b's entries but skip as request attributes.
func bucketAttributes(b map[string]string, skip string) map[string]string {
	out := make(map[string]string, len(b))
	for k, v := range b {
		if k != skip {
			out[policy.EnvoyAttribute(k)] = checkapi.EnvoyValue(v)
		}
	}
	return out
}
