package rlqs

import (
	"errors"
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/policy"
)

// bucketTestConfig is an envoyproxy/ratelimit configuration with exact
// values and key-only entries at several depths.
const bucketTestConfig = `domain: shop
edge: {instances: 2, no_assignment: deny}
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /pay
        rate_limit: {unit: second, requests_per_unit: 2}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: internal
    rate_limit: {unlimited: true}
`

func bucketTestSet(t testing.TB) (checkapi.EnvoyIndex, *admission.PolicySet) {
	t.Helper()
	ps, err := policy.ParseEnvoyConfig([]byte(bucketTestConfig))
	if err != nil {
		t.Fatal(err)
	}
	more, err := policy.ParsePolicies([]byte("name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nedge: {instances: 4, no_assignment: deny}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ps = append(ps, more...)
	var set admission.PolicySet
	if err := set.Set(ps); err != nil {
		t.Fatal(err)
	}
	return checkapi.BuildEnvoyIndex(ps), &set
}

// A bucket id names what an RLS descriptor of the same entries names: in
// a configured domain, the configuration's limit (an exact value before
// key-only); elsewhere the policy its "policy" entry names.
func TestMatchBucket(t *testing.T) {
	ix, set := bucketTestSet(t)
	for _, c := range []struct {
		domain string
		b      map[string]string
		want   string // policy name, "" for no limit, or an error's text
		err    bool
	}{
		{"shop", map[string]string{"tenant": "globex"}, "shop.tenant", false},
		{"shop", map[string]string{"tenant": "acme"}, "shop.tenant_acme", false},
		{"shop", map[string]string{"tenant": "globex", "path": "/pay"}, "shop.tenant.path__pay", false},
		{"shop", map[string]string{"tenant": "globex", "path": "/cart"}, "shop.tenant.path", false},
		{"shop", map[string]string{"tenant": "acme", "path": "/pay"}, "", false}, // the exact branch has no path: no limit, as RLS
		{"shop", map[string]string{"internal": "x"}, "", false},                  // unlimited
		{"shop", map[string]string{"other": "x"}, "", false},
		{"any", map[string]string{"policy": "api", "tenant": "acme"}, "api", false},
		{"any", map[string]string{"generic_key": "api", "tenant": "acme"}, "api", false},
		{"any", map[string]string{"policy": "nope", "tenant": "acme"}, "unknown policy", true},
		{"any", map[string]string{"tenant": "acme"}, "no entry \"policy\"", true},
		{"any", map[string]string{"policy": "api", "tenant": "a", "route": "b"}, "must be exactly those", true},
		{"any", map[string]string{}, "0 entries", true},
		{"any", map[string]string{strings.Repeat("k", 200): "v"}, "longer than", true},
	} {
		m, err := matchBucket(ix, set, c.domain, c.b)
		switch {
		case c.err && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %v: error %v, want one saying %q", c.domain, c.b, err, c.want)
		case !c.err && err != nil:
			t.Errorf("%s %v: %v", c.domain, c.b, err)
		case !c.err && c.want == "" && m.pol != nil:
			t.Errorf("%s %v: matched %s, want no limit", c.domain, c.b, m.pol.Name)
		case !c.err && c.want != "" && (m.pol == nil || !strings.HasPrefix(m.pol.Name, c.want)):
			t.Errorf("%s %v: matched %+v, want %s", c.domain, c.b, m.pol, c.want)
		}
	}
}

// FuzzMatchBucket: any bucket id in any domain is matched or refused with
// a clear error, never a panic; the same id always names the same thing;
// a matched one carries its policy's identity; and where its entries
// follow the configuration's order, it names what the RLS descriptor of
// those entries names.
func FuzzMatchBucket(f *testing.F) {
	f.Add("shop", "tenant\x00globex\x00path\x00/pay")
	f.Add("shop", "tenant\x00acme")
	f.Add("any", "policy\x00api\x00tenant\x00acme")
	f.Add("shop", "internal\x00x\x00tenant\x00y")
	f.Add("", "\x00\x00\x00")
	ix, set := bucketTestSet(f)
	f.Fuzz(func(t *testing.T, domain, entries string) {
		parts := strings.Split(entries, "\x00")
		b := map[string]string{}
		var ordered []*commonrl.RateLimitDescriptor_Entry
		for i := 0; i+1 < len(parts); i += 2 {
			if _, dup := b[parts[i]]; !dup {
				ordered = append(ordered, &commonrl.RateLimitDescriptor_Entry{Key: parts[i], Value: parts[i+1]})
			}
			b[parts[i]] = parts[i+1]
		}
		m, err := matchBucket(ix, set, domain, b)
		m2, err2 := matchBucket(ix, set, domain, b)
		if (err == nil) != (err2 == nil) || m.pol != m2.pol {
			t.Fatalf("%q %v: matched differently twice", domain, b)
		}
		if err != nil {
			if !errors.Is(err, errBadBucket) && !admission.IsInputError(err) {
				t.Fatalf("%q %v: error %v is no input error", domain, b, err)
			}
			return
		}
		if m.pol != nil {
			if _, err := m.pol.IdentityOf(m.attrs); err != nil && !errors.Is(err, policy.ErrInvalidIdentity) {
				t.Fatalf("%q %v: identity: %v", domain, b, err)
			}
		}
		if p, configured := ix.Match(domain, ordered); configured && len(ordered) == len(b) && p != nil && !p.Envoy.Unlimited {
			// The RLS walk found a limit in the entries' order; the
			// bucket, in the configuration's order, finds one at least as
			// specific (the same, for this configuration).
			if m.pol != p {
				t.Fatalf("%q %v: bucket matched %v, the descriptor %s", domain, b, m.pol, p.Name)
			}
		}
	})
}
