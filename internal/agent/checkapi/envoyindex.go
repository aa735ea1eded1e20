package checkapi

import (
	"slices"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/quota-lease/quota-lease/policy"
)

// EnvoyIndex finds the policy an Envoy descriptor matches in a domain
// loaded from an envoyproxy/ratelimit configuration (policy.EnvoyMatch),
// by that service's rule: walk the descriptor's entries from the first,
// at each taking the child for the entry's key and value if the config
// has one, else the child for the key alone; the policy is the last
// node's. So an exact value wins over key-only, entry by entry.
type EnvoyIndex map[string]*envoyNode // by domain

type envoyNode struct {
	children map[string]*envoyNode
	policy   *policy.Policy
}

func envoyChildKey(key, value string) string { return key + "\x00" + value }

func BuildEnvoyIndex(ps []*policy.Policy) EnvoyIndex {
	ix := EnvoyIndex{}
	for _, p := range ps {
		if p.Envoy == nil {
			continue
		}
		n := ix[p.Envoy.Domain]
		if n == nil {
			n = &envoyNode{children: map[string]*envoyNode{}}
			ix[p.Envoy.Domain] = n
		}
		for _, e := range p.Envoy.Entries {
			k := e.Key
			if e.Value != "" {
				k = envoyChildKey(e.Key, e.Value)
			}
			c := n.children[k]
			if c == nil {
				c = &envoyNode{children: map[string]*envoyNode{}}
				n.children[k] = c
			}
			n = c
		}
		n.policy = p
	}
	return ix
}

// Match returns the policy of entries in domain (nil: no limit applies),
// and whether the domain is one loaded from a configuration at all.
func (ix EnvoyIndex) Match(domain string, entries []*commonrl.RateLimitDescriptor_Entry) (*policy.Policy, bool) {
	n, ok := ix[domain]
	if !ok {
		return nil, false
	}
	for _, e := range entries {
		next := n.children[envoyChildKey(e.Key, e.Value)]
		if next == nil {
			next = n.children[e.Key]
		}
		if next == nil {
			return nil, true
		}
		n = next
	}
	return n.policy, true
}

// MatchMap is Match for entries given as a map (an RLQS bucket id): it takes them in the
// order the configuration's tree asks for them, at each node the entry
// whose key and value have a child, else one whose key alone has, the
// smallest key first among several. So an exact value wins over key-only,
// entry by entry, as in Match; every entry must be used.
func (ix EnvoyIndex) MatchMap(domain string, b map[string]string) (*policy.Policy, bool) {
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

// envoyMatched is what the configuration says of one descriptor beyond
// its admission request, for its answer: it matched an unlimited limit,
// or the limit applied to it is in quota_mode (policy.EnvoyMatch.
// QuotaMode; a replaced or unlimited limit is not applied, so it is not);
// and whether it returns hits (is_negative_hits).
type envoyMatched struct{ unlimited, quota, ret bool }
