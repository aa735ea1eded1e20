package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEdgeSettings(t *testing.T) {
	base := "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n"
	ps, err := ParsePolicies([]byte(base + "edge: {instances: 20, no_assignment: deny, expired: {rule: token_bucket, max_tokens: 2, tokens_per_second: 1, timeout: 30s}, ttl: 4s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := ps[0].Edge
	if e.Instances != 20 || e.EdgeTTL() != 4*time.Second || e.ExpiredRule() != EdgeTokenBucket || e.Unbounded() {
		t.Fatalf("parsed %+v", e)
	}
	ps, _ = ParsePolicies([]byte(base + "edge: {instances: 1, no_assignment: allow}\n"))
	if e := ps[0].Edge; e.EdgeTTL() != DefaultEdgeTTL || e.ExpiredRule() != EdgeAllow || !e.Unbounded() {
		t.Fatalf("defaults: %+v", e)
	}
	for _, c := range []struct{ yaml, want string }{
		{"edge: {no_assignment: deny}\n", `field "edge.instances": must be 1 to 100000`},
		{"edge: {instances: 2}\n", `field "edge.no_assignment": ""; say what Envoy`},
		{"edge: {instances: 2, no_assignment: token_bucket}\n", "cannot be a token bucket"},
		{"edge: {instances: 2, no_assignment: deny, expired: {rule: token_bucket, max_tokens: 1, tokens_per_second: 1}}\n", "timeout must be whole seconds"},
		{"edge: {instances: 2, no_assignment: deny, expired: {rule: token_bucket, max_tokens: 0, tokens_per_second: 1, timeout: 1s}}\n", "at least 1"},
		{"edge: {instances: 2, no_assignment: deny, expired: {rule: deny, max_tokens: 3}}\n", "apply only to rule token_bucket"},
		{"edge: {instances: 2, no_assignment: deny, expired: {rule: maybe}}\n", `rule "maybe"`},
		{"edge: {instances: 2, no_assignment: deny, ttl: 1500ms}\n", `field "edge.ttl": must be whole seconds`},
		{"edge: {instances: 2, no_assignment: deny, ttl: 2h}\n", `field "edge.ttl"`},
		{"scope: region\nedge: {instances: 2, no_assignment: deny}\n", "applies only to global policies"},
		{"edge: {instances: 2, no_assignment: deny, colour: red}\n", "field colour not found"},
	} {
		_, err := ParsePolicies([]byte(base + c.yaml))
		if err == nil || !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want an invalid-policy error mentioning %q", c.yaml, err, c.want)
		}
	}
}

// An envoyproxy/ratelimit configuration's edge settings apply to every
// limit it defines, but not to unlimited ones (they limit nothing).
func TestEnvoyConfigEdge(t *testing.T) {
	ps, err := ParseEnvoyConfig([]byte(`domain: shop
edge: {instances: 3, no_assignment: deny}
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: internal
    rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if got := p.Edge != nil; got == p.Envoy.Unlimited {
			t.Errorf("%s (unlimited %v): edge %+v", p.Name, p.Envoy.Unlimited, p.Edge)
		}
	}
}
