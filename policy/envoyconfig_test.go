package policy

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const envoyMongo = `domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`

const envoyMessaging = `domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: to_number
    value: "911"
    rate_limit:
      unlimited: true
`

// envoyproxy/ratelimit's README configurations load unchanged, one policy
// per limited descriptor, fixed window, counting by the path's keys.
func TestParseEnvoyConfig(t *testing.T) {
	ps, err := ParsePolicyFile([]byte(envoyMongo))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Name != "mongo_cps.database_users" || ps[0].Algorithm != FixedWindow || ps[0].Limit != 500 ||
		time.Duration(ps[0].Period) != time.Second || strings.Join(ps[0].Identity, ",") != "database" ||
		ps[0].Envoy.Domain != "mongo_cps" || ps[0].Envoy.Entries[0] != (EnvoyEntry{Key: "database", Value: "users"}) {
		t.Fatalf("mongo_cps: %+v", ps[0])
	}
	ps, err = ParsePolicyFile([]byte(envoyMessaging))
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, p := range ps {
		names = append(names, p.Name)
	}
	if strings.Join(names, " ") != "messaging.message_type_marketing.to_number messaging.to_number messaging.to_number_911" {
		t.Fatalf("messaging policies %v", names)
	}
	if u := ps[2]; !u.Envoy.Unlimited || u.Scope != ScopeRegion {
		t.Fatalf("unlimited descriptor: %+v, want a never-enforced placeholder", u)
	}
	if strings.Join(ps[0].Identity, ",") != "message_type,to_number" || time.Duration(ps[0].Period) != 24*time.Hour {
		t.Fatalf("nested descriptor: %+v", ps[0])
	}
}

func TestParseEnvoyConfigErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "unit"},
		{"domain: d\ndescriptors:\n  - value: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "no key"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limits: {unit: second}\n", "rate_limits"},
		{"domain: d\ndescriptors:\n  - key: a\n", "no descriptor has a rate_limit"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0}\n", "limit"},
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: X}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1, name: X}\n", "name"},
	} {
		_, err := ParsePolicyFile([]byte(c.yaml))
		if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an invalid-policy error mentioning %q", c.yaml, err, c.want)
		}
	}
}

func TestEnvoyPolicyNames(t *testing.T) {
	long := strings.Repeat("k", 80)
	for _, c := range []struct {
		path []EnvoyEntry
		ok   func(string) bool
	}{
		{[]EnvoyEntry{{Key: "a", Value: "b"}}, func(n string) bool { return n == "d.a_b" }},
		{[]EnvoyEntry{{Key: "Header", Value: "X Y"}}, func(n string) bool { return strings.HasPrefix(n, "d.header_x_y-") }},
		{[]EnvoyEntry{{Key: long}}, func(n string) bool { return len(n) <= 63 }},
	} {
		n := envoyPolicyName("d", c.path)
		if !c.ok(n) || !policyNameRE.MatchString(n) {
			t.Errorf("%v: name %q", c.path, n)
		}
	}
}

// A limit's configured rate_limit.name is kept as written (Envoy answers
// report it, as envoyproxy/ratelimit does); a limit the configuration
// names none of keeps none, though its policy gets a generated name. The
// name survives storing the policy (JSON, as the coordinator stores it).
func TestEnvoyConfigKeepsConfiguredNames(t *testing.T) {
	ps, err := ParsePolicyFile([]byte("domain: rp\ndescriptors:\n  - key: key1\n    rate_limit: {unit: minute, requests_per_unit: 1, name: key1-limit}\n" +
		"  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: key3\n    rate_limit: {unlimited: true, name: open}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"key1-limit", "", "open"} {
		if ps[i].Envoy.Name != want || ps[i].EnvoyLimitName() != want {
			t.Errorf("policy %s: envoy name %q (limit name %q), want %q", ps[i].Name, ps[i].Envoy.Name, ps[i].EnvoyLimitName(), want)
		}
	}
	// Stored before the configured name was kept: a policy name other than
	// the generated one is the configured name.
	old := *ps[0]
	old.Envoy = &EnvoyMatch{Domain: "rp", Entries: ps[0].Envoy.Entries}
	if old.EnvoyLimitName() != "key1-limit" {
		t.Errorf("policy stored without envoy.name: limit name %q, want key1-limit", old.EnvoyLimitName())
	}
	if ps[1].Name != "rp.key2" {
		t.Errorf("unnamed limit's policy is %q, want the generated rp.key2", ps[1].Name)
	}
	b, err := json.Marshal(ps[0])
	if err != nil {
		t.Fatal(err)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || back.Envoy.Name != "key1-limit" {
		t.Fatalf("stored and read back: %+v %v, want envoy name key1-limit", back.Envoy, err)
	}
}

// quota_mode (envoyproxy/ratelimit's soft limit, src/config/config_impl.go
// YamlDescriptor.QuotaMode) is kept on the descriptor's limit and survives
// storing the policy; on a descriptor without a rate_limit it is accepted
// and means nothing, as in the original; anything but a boolean is
// refused, naming the field.
func TestEnvoyConfigQuotaMode(t *testing.T) {
	ps, err := ParsePolicyFile([]byte("domain: q\ndescriptors:\n  - key: user\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n" +
		"  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: org\n    quota_mode: true\n    descriptors:\n      - key: team\n        rate_limit: {unit: hour, requests_per_unit: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if ps[i].Envoy.QuotaMode != want {
			t.Errorf("policy %s: quota_mode %v, want %v", ps[i].Name, ps[i].Envoy.QuotaMode, want)
		}
	}
	b, err := json.Marshal(ps[0])
	if err != nil {
		t.Fatal(err)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || !back.Envoy.QuotaMode {
		t.Fatalf("stored and read back: %+v %v, want quota_mode kept", back.Envoy, err)
	}
	_, err = ParsePolicyFile([]byte("domain: q\ndescriptors:\n  - key: user\n    quota_mode: sometimes\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"))
	if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "sometimes") {
		t.Fatalf("quota_mode: sometimes: %v, want an invalid-policy error naming the value", err)
	}
}
