package agent

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// An RLQS bucket names what it counts as an Envoy RLS descriptor does
// (envoy.go), its entries being a map instead of a list:
//
//   - in a domain loaded from an envoyproxy/ratelimit configuration, the
//     entries pick the descriptor's limit as envoyIndex.match does, taking
//     them in the configuration's order (envoyIndex.matchMap); no match,
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
// (maxBucketBytes × EdgeConfig.MaxBucketsPerStream). A value longer than
// policy.MaxAttributeValueBytes counts by its hash (envoyValue).
const (
	maxBucketEntries  = 16
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
func matchBucket(ix envoyIndex, policies admission.Policies, domain string, b map[string]string) (rlqsMatch, error) {
	if err := boundedBucket(b); err != nil {
		return rlqsMatch{}, err
	}
	if p, configured := ix.matchMap(domain, b); configured {
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
		return rlqsMatch{}, fmt.Errorf("%w: domain %s is no envoyproxy/ratelimit configuration's, and no entry \"policy\" names a policy", errBadBucket, policy.QuoteName(domain))
	}
	p, ok := policies.Policy(name)
	if !ok {
		return rlqsMatch{}, fmt.Errorf("%w %s", admission.ErrUnknownPolicy, policy.QuoteName(name))
	}
	attrs := bucketAttributes(b, nameKey)
	if len(attrs) != len(p.Identity) {
		return rlqsMatch{}, fmt.Errorf("%w: policy %s counts by %s; the bucket's other entries must be exactly those", errBadBucket, policy.QuoteName(p.Name), strings.Join(p.Identity, ", "))
	}
	return rlqsMatch{pol: p, attrs: attrs}, nil
}

// boundedBucket refuses a bucket id beyond the caps: no entries or more
// than maxBucketEntries, a key empty or over maxBucketKeyBytes, more than
// maxBucketBytes in all.
func boundedBucket(b map[string]string) error {
	if len(b) == 0 || len(b) > maxBucketEntries {
		return fmt.Errorf("%w: %d entries, want 1-%d", errBadBucket, len(b), maxBucketEntries)
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
			out[policy.EnvoyAttribute(k)] = envoyValue(v)
		}
	}
	return out
}

// matchMap is match for entries given as a map: it takes them in the
// order the configuration's tree asks for them, at each node the entry
// whose key and value have a child, else one whose key alone has, the
// smallest key first among several. So an exact value wins over key-only,
// entry by entry, as in match; every entry must be used.
func (ix envoyIndex) matchMap(domain string, b map[string]string) (*policy.Policy, bool) {
	n, ok := ix[domain]
	if !ok {
		return nil, false
	}
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	used := make([]bool, len(keys))
	for range keys {
		var next *envoyNode
		at := -1
		for _, exact := range []bool{true, false} {
			for i, k := range keys {
				if used[i] {
					continue
				}
				ck := k
				if exact {
					ck = envoyChildKey(k, b[k])
				}
				if c := n.children[ck]; c != nil {
					next, at = c, i
					break
				}
			}
			if next != nil {
				break
			}
		}
		if next == nil {
			return nil, true
		}
		used[at], n = true, next
	}
	return n.policy, true
}
