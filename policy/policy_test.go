package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParsePoliciesDefaults(t *testing.T) {
	ps, err := ParsePolicies([]byte(`
name: api
identity: [tenant, route]
limit: 100
period: 1m
`))
	if err != nil {
		t.Fatal(err)
	}
	p := ps[0]
	if p.Algorithm != TokenBucket || p.Burst != 100 || p.Cost != 1 || p.Scope != ScopeGlobal || p.Failure.Mode != FailClosed {
		t.Fatalf("defaults not applied: %+v", p)
	}
	l := p.Limits()
	if l.Capacity != 100*Micro || l.Rate != 1_666_666 {
		t.Fatalf("limits %+v, want capacity 100 and 1.666666/s rounded down", l)
	}
}

func TestParsePoliciesErrors(t *testing.T) {
	base := "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n"
	cases := []struct{ yaml, want string }{
		{"", "no policy found"},
		{base + "cost: 9223372036854775807\n", `field "cost": default cost 9223372036854775807 exceeds the capacity 10`},
		{base + "failure: {fallback_start: 1.5}\n", `field "failure.fallback_start": must be a fraction in [0, 1]`},
		{base + "failure: {fallback_start: -0.1}\n", `field "failure.fallback_start"`},
		{base + "limt: 5\n", "field limt not found"},
		{strings.Replace(base, "limit: 10", "limit: .nan", 1), `field "limit": must be a positive finite number, got NaN`},
		{strings.Replace(base, "limit: 10", "limit: -1", 1), `field "limit"`},
		{strings.Replace(base, "limit: 10", "limit: .inf", 1), `field "limit"`},
		{strings.Replace(base, "period: 1s", "period: 60", 1), "duration must be a string with a unit"},
		{strings.Replace(base, "period: 1s", "period: 1us", 1), `field "period"`},
		{strings.Replace(base, "period: 1s", "period: banana", 1), `duration "banana"`},
		{strings.Replace(base, "name: api", "name: Bad Name", 1), `field "name"`},
		{strings.Replace(base, "[tenant]", "[]", 1), `field "identity"`},
		{strings.Replace(base, "[tenant]", "[tenant, tenant]", 1), "listed twice"},
		{strings.Replace(base, "[tenant]", "[Tenant]", 1), `attribute "Tenant"`},
		{base + "algorithm: leaky\n", `unknown "leaky"`},
		{base + "algorithm: fixed_window\nburst: 5\n", "applies only to token_bucket"},
		{strings.Replace(base, "limit: 10", "limit: 2.5", 1) + "algorithm: sliding_log\n", "whole number"},
		{strings.Replace(base, "limit: 10", "limit: 20000", 1) + "algorithm: sliding_log\n", "exceeds 10000 entries"},
		{base + "burst: .nan\n", `field "burst"`},
		{base + "cost: -1\n", `field "cost"`},
		{base + "cost: 11\n", "exceeds the capacity"},
		{base + "scope: planet\n", `field "scope"`},
		{base + "failure: {mode: panic}\n", `field "failure.mode"`},
		{base + "failure: {mode: static-share, static_fraction: 1.5}\n", `field "failure.static_fraction"`},
		{base + "failure: {mode: fail-open}\n", `field "failure.open_fraction"`},
		{base + "failure: {mode: last-lease, decay: -1s}\n", `field "failure.decay"`},
		{strings.Replace(base, "limit: 10", "limit: 1e300", 1), "too large"},
		{strings.Replace(base, "limit: 10", "limit: 0.0000001", 1) + "burst: 1\n", "rate 0"},
		{base + "---\n" + base, "defined twice"},
		{"name: [unclosed\n", "document 1"},
		{base + "version: -2\n", `field "version"`},
		{base + "floors: {us: 6, eu: 5}\n", "below the sum of the regions' floors"},
		{base + "floors: {US: 1}\n", `region name "US"`},
		{base + "floors: {us: .nan}\n", `field "floors"`},
		{base + "scope: region\nfloors: {us: 1}\n", "only to global"},
		{base + "shards: -1\n", `field "shards": must be 0 to 64`},
		{base + "shards: 65\n", `field "shards": must be 0 to 64`},
		{base + "shards: 11\n", `field "shards": 11 shards leave each a capacity of 0.90909, which cannot hold the default cost 1; use fewer shards`},
		{base + "identity_shares: -1\n", `field "identity_shares": must be 0 to 100000`},
		{base + "identity_shares: 100001\n", `field "identity_shares": must be 0 to 100000`},
		{base + "scope: region\nidentity_shares: 5\n", `field "identity_shares": apply only to global policies`},
		{base + "shards: 5\ncost: 3\n", "cannot hold the default cost 3"},
	}
	for _, c := range cases {
		_, err := ParsePolicies([]byte(c.yaml))
		if err == nil || !errors.Is(err, ErrInvalidPolicy) && !errors.Is(err, ErrInvalidLimits) {
			t.Errorf("%q: error %v, want an invalid-policy error", c.yaml, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n error %q\n want it to mention %q", c.yaml, err, c.want)
		}
	}
}

// A policy's limits split into shards are rounded down, never add up to
// more than the whole, and a change of the shard count starts fresh keys
// as a new version does.
func TestShardLimits(t *testing.T) {
	p := &Policy{Name: "api", Identity: []string{"tenant"}, Limit: 10, Period: Duration(time.Second), Burst: 22, Shards: 4}
	p.Normalize()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	full := p.Limits()
	sl := p.ShardLimits(full)
	if sl.Capacity != 5_500_000 || sl.Rate != 2_500_000 {
		t.Fatalf("a quarter of %+v: %+v, want capacity 5.5 and rate 2.5", full, sl)
	}
	share, _ := full.Share(full.Amount() / 3)
	if part := p.ShardLimits(share); 4*part.Capacity > share.Capacity || 4*part.Rate > share.Rate {
		t.Fatalf("4 parts of %+v add up to more: %+v", share, part)
	}
	one := *p
	one.Shards = 0
	if one.ShardCount() != 1 || one.ShardLimits(full) != full {
		t.Fatalf("0 shards: count %d, limits %+v, want one key with the whole", one.ShardCount(), one.ShardLimits(full))
	}
	bumped := one
	bumped.Version++
	for _, c := range []struct {
		prev, next *Policy
		want       bool
	}{{&one, &one, false}, {&one, p, true}, {&one, &bumped, true}} {
		if got := StartsFresh(c.prev, c.next); got != c.want {
			t.Errorf("StartsFresh(%d shards v%d, %d shards v%d) = %v, want %v", c.prev.Shards, c.prev.Version, c.next.Shards, c.next.Version, got, c.want)
		}
	}
}
