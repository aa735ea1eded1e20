package ratelimitxds

import (
	"encoding/json"
	"strings"
	"testing"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/policy"
)

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func limit(unit rlsconf.RateLimitUnit, n uint32) *rlsconf.RateLimitPolicy {
	return &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
}

// The README's messaging configuration, as envoyproxy/ratelimit's file
// and as the RateLimitConfig an xDS server would send for it.
const messagingYAML = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100, name: per_number}
    shadow_mode: true
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unlimited: true, name: office, replaces: [{name: per_number}]}
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: SECOND, requests_per_unit: 50}
`

func messagingProto() *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: "messaging-cfg", Domain: "messaging", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "message_type", Value: "marketing", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "to_number", RateLimit: limit(rlsconf.RateLimitUnit_DAY, 5)}}},
		{Key: "to_number", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: 100, Name: "per_number"}, ShadowMode: true},
		{Key: "remote_address", Value: "10.0.0.1", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true, Name: "office",
			Replaces: []*rlsconf.RateLimitReplace{{Name: "per_number"}}}},
		{Key: "api_key", DetailedMetric: true, RateLimit: limit(rlsconf.RateLimitUnit_SECOND, 50)},
	}}
}

// A RateLimitConfig becomes exactly the policies its file becomes: one
// conversion, whichever way the configuration came.
func TestConvertEqualsFile(t *testing.T) {
	want, err := policy.ParseEnvoyConfig([]byte(messagingYAML))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Convert("v1", []*anypb.Any{mustAny(t, messagingProto())})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Policies) != len(want) {
		t.Fatalf("%d policies, the file gives %d", len(got.Policies), len(want))
	}
	byName := map[string]*policy.Policy{}
	for _, p := range want {
		byName[p.Name] = p
	}
	for _, p := range got.Policies {
		w := byName[p.Name]
		a, _ := json.Marshal(p)
		b, _ := json.Marshal(w)
		if w == nil || string(a) != string(b) {
			t.Errorf("policy %s:\n xDS  %s\n file %s", p.Name, a, b)
		}
		if got.Resource[p.Name] != "messaging-cfg" {
			t.Errorf("policy %s: resource %q", p.Name, got.Resource[p.Name])
		}
	}
	if got.Version != "v1" {
		t.Errorf("version %q", got.Version)
	}
}

// A response that cannot be converted whole is refused with a reason that
// names the resource, and nothing of it is returned.
func TestConvertRefuses(t *testing.T) {
	other := &rlsconf.RateLimitConfig{Name: "b", Domain: "messaging", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: limit(rlsconf.RateLimitUnit_MINUTE, 10)}}}
	named := func(domain, name string) *rlsconf.RateLimitConfig {
		return &rlsconf.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: 10, Name: name}}}}
	}
	bad := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0xff, 0xff, 0xff}}
	wrongType := mustAny(t, &rlsconf.RateLimitReplace{Name: "x"})
	cases := map[string]struct {
		res  []*anypb.Any
		want string
	}{
		"unknown unit": {[]*anypb.Any{mustAny(t, &rlsconf.RateLimitConfig{Name: "u", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "k", RateLimit: limit(rlsconf.RateLimitUnit_UNKNOWN, 10)}}})}, `resource "u"`},
		"no domain":          {[]*anypb.Any{mustAny(t, &rlsconf.RateLimitConfig{Name: "nd"})}, "domain"},
		"no key":             {[]*anypb.Any{mustAny(t, &rlsconf.RateLimitConfig{Name: "nk", Domain: "d", Descriptors: []*rlsconf.RateLimitDescriptor{{RateLimit: limit(rlsconf.RateLimitUnit_SECOND, 1)}}})}, "no key"},
		"duplicate domain":   {[]*anypb.Any{mustAny(t, messagingProto()), mustAny(t, other)}, "both configure domain"},
		"one name, two docs": {[]*anypb.Any{mustAny(t, named("d1", "same")), mustAny(t, named("d2", "same"))}, "both have a limit that maps to policy"},
		"garbage":            {[]*anypb.Any{bad}, "resource 0"},
		"wrong type":         {[]*anypb.Any{wrongType}, "only " + TypeURL},
	}
	for name, c := range cases {
		got, err := Convert("v", c.res)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
		if len(got.Policies) != 0 {
			t.Errorf("%s: %d policies returned with the error", name, len(got.Policies))
		}
	}
}

// An empty response is an empty configuration (every managed policy goes),
// not an error: envoyproxy/ratelimit loads it as one too.
func TestConvertEmpty(t *testing.T) {
	got, err := Convert("v0", nil)
	if err != nil || len(got.Policies) != 0 {
		t.Fatalf("%v, %v", got, err)
	}
}

// Whatever bytes a resource holds, Convert answers policies or an error,
// never panics, and what it answers are valid policies.
func FuzzConvert(f *testing.F) {
	seed, _ := proto.Marshal(messagingProto())
	f.Add(seed)
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Convert("v", []*anypb.Any{{TypeUrl: TypeURL, Value: b}})
		if err != nil {
			return
		}
		for _, p := range got.Policies {
			if err := p.Validate(); err != nil {
				t.Fatalf("policy %s invalid: %v", p.Name, err)
			}
		}
	})
}
