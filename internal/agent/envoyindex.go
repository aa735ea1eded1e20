package agent

import (
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/quota-lease/quota-lease/policy"
)

// envoyIndex finds the policy an Envoy descriptor matches in a domain
// loaded from an envoyproxy/ratelimit configuration (policy.EnvoyMatch),
// by that service's rule: walk the descriptor's entries from the first,
// at each taking the child for the entry's key and value if the config
// has one, else the child for the key alone; the policy is the last
// node's. So an exact value wins over key-only, entry by entry.
type envoyIndex map[string]*envoyNode // by domain

type envoyNode struct {
	children map[string]*envoyNode
	policy   *policy.Policy
}

func envoyChildKey(key, value string) string { return key + "\x00" + value }

func buildEnvoyIndex(ps []*policy.Policy) envoyIndex {
	ix := envoyIndex{}
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

// match returns the policy of entries in domain (nil: no limit applies),
// and whether the domain is one loaded from a configuration at all.
func (ix envoyIndex) match(domain string, entries []*commonrl.RateLimitDescriptor_Entry) (*policy.Policy, bool) {
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

// envoyIndex is the index of the policies in force; nil until they are
// loaded (nothing configured).
func (a *Agent) envoyIndex() envoyIndex {
	if p := a.envoy.Load(); p != nil {
		return *p
	}
	return nil
}
