package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// EnvoyMatch ties a policy to one descriptor of an envoyproxy/ratelimit
// configuration: the domain and the path of entries (a key, and a value or
// none for "any value, each its own limit") a request descriptor must
// match, entry for entry, for the policy to apply.
type EnvoyMatch struct {
	Domain  string       `yaml:"domain" json:"domain"`
	Entries []EnvoyEntry `yaml:"descriptor" json:"descriptor"`
	// Replaces names policies this one replaces when both match
	// descriptors of one request (envoyproxy/ratelimit's replaces).
	Replaces []string `yaml:"replaces,omitempty" json:"replaces,omitempty"`
	// Unlimited marks a descriptor configured as unlimited: a request
	// matching it gets no limit, and a less specific descriptor does not
	// apply either. Such a policy is never enforced; its limit and period
	// are placeholders (1 per second, region scope, so it is never leased).
	Unlimited bool `yaml:"unlimited,omitempty" json:"unlimited,omitempty"`
	// Name is the descriptor's rate_limit.name as the configuration
	// writes it, or "" where it names none (the policy's name is then
	// generated from the path). Envoy answers report it as the limit's
	// name, as envoyproxy/ratelimit does: a name only where one is
	// configured.
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// QuotaMode marks the descriptor's limit as a soft limit
	// (envoyproxy/ratelimit's quota_mode): the limit is decided and
	// counted as any other, but a request over it does not make an Envoy
	// call OVER_LIMIT; the answer reports the descriptor OK and, with
	// dynamic metadata on, names it among the call's quota violations.
	QuotaMode bool `yaml:"quota_mode,omitempty" json:"quota_mode,omitempty"`
}

// EnvoyEntry is one entry of a descriptor path.
type EnvoyEntry struct {
	Key   string `yaml:"key" json:"key"`
	Value string `yaml:"value,omitempty" json:"value,omitempty"`
}

// EnvoyAttribute is the attribute name a descriptor key is counted under:
// remote_address is ip, as in the rest of the agent; other keys are
// lower-cased with anything but a-z, 0-9, '_', '.', '-' made '_'.
func EnvoyAttribute(key string) string {
	if key == "remote_address" {
		return "ip"
	}
	s := nameChars(key)
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		s = "k" + s
	}
	if len(s) > 32 {
		s = s[:32]
	}
	return s
}

// EnvoyConfig is envoyproxy/ratelimit's configuration, field for field,
// as its YAML files write it and as its xDS RateLimitConfig resources carry
// it; Algorithm, Scope and Edge are quota-lease's optional additions. Policies
// maps it onto policies: the one conversion, whichever way it came.
type EnvoyConfig struct {
	Domain      string            `yaml:"domain"`
	Descriptors []EnvoyDescriptor `yaml:"descriptors"`
	// Algorithm for every limit of the file: fixed_window (the default,
	// what envoyproxy/ratelimit does) or any other.
	Algorithm Algorithm `yaml:"algorithm"`
	// Scope of every limit: global (the default) or region.
	Scope Scope `yaml:"scope"`
	// Edge serves every limit of the file to Envoy's Rate Limit Quota
	// Service (Policy.Edge); unlimited ones are never served.
	Edge *Edge `yaml:"edge"`
	// PostHoc: every limit of the file counts every hit, admitted or not,
	// as envoyproxy/ratelimit's counters do (Policy.PostHoc): the default;
	// false counts only admitted hits. A limit that takes returns never
	// does. MaxCost and MaxInFlight size the overshoot for the bound
	// (Policy.MaxCost).
	PostHoc     *bool `yaml:"post_hoc"`
	MaxCost     int64 `yaml:"max_cost"`
	MaxInFlight int64 `yaml:"max_in_flight"`
}

// postHoc reports whether a limit of f that does or does not take returns
// counts charges after the fact.
func (f EnvoyConfig) postHoc(returns bool) bool {
	return !returns && (f.PostHoc == nil || *f.PostHoc)
}

// EnvoyDescriptor is one descriptor of an EnvoyConfig, with those nested
// under it.
type EnvoyDescriptor struct {
	Key            string            `yaml:"key"`
	Value          string            `yaml:"value"`
	RateLimit      *EnvoyRateLimit   `yaml:"rate_limit"`
	Descriptors    []EnvoyDescriptor `yaml:"descriptors"`
	ShadowMode     bool              `yaml:"shadow_mode"`
	QuotaMode      bool              `yaml:"quota_mode"`
	DetailedMetric bool              `yaml:"detailed_metric"`
	// Returns is quota-lease's own: the limit accepts the hits Envoy
	// returns (is_negative_hits), Policy.Returns.
	Returns bool `yaml:"returns"`
}

// EnvoyRateLimit is a descriptor's rate_limit. Unit is one of second,
// minute, hour, day, week, month or year, in any case.
type EnvoyRateLimit struct {
	Unit            string         `yaml:"unit"`
	RequestsPerUnit uint32         `yaml:"requests_per_unit"`
	Unlimited       bool           `yaml:"unlimited"`
	Name            string         `yaml:"name"`
	Replaces        []EnvoyReplace `yaml:"replaces"`
}

// EnvoyReplace names a limit a rate_limit replaces.
type EnvoyReplace struct {
	Name string `yaml:"name"`
}

var envoyUnitPeriods = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
	"week": 7 * 24 * time.Hour, "month": 30 * 24 * time.Hour, "year": 365 * 24 * time.Hour,
}

// IsEnvoyConfig reports whether data looks like an envoyproxy/ratelimit
// configuration (a top-level domain) rather than quota-lease policies.
func IsEnvoyConfig(data []byte) bool {
	var probe struct {
		Domain string `yaml:"domain"`
	}
	return yaml.Unmarshal(data, &probe) == nil && probe.Domain != ""
}

// ParseEnvoyConfig reads an envoyproxy/ratelimit configuration file and
// maps it onto policies (EnvoyConfig.Policies). Every policy or an error.
func ParseEnvoyConfig(data []byte) ([]*Policy, error) {
	if len(data) > MaxPolicyFileBytes {
		return nil, fmt.Errorf("%w: file is %d bytes, more than %d", ErrInvalidPolicy, len(data), MaxPolicyFileBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f EnvoyConfig
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: envoy ratelimit config: %v", ErrInvalidPolicy, err)
	}
	return f.Policies()
}

// Policies maps the configuration onto policies: one per descriptor with
// a rate limit, matching the descriptor's path in the domain (EnvoyMatch),
// counting by the path's keys, fixed window by default. A descriptor
// marked unlimited becomes a placeholder policy that is never enforced
// (EnvoyMatch.Unlimited), so that it still wins over less specific
// descriptors, as in envoyproxy/ratelimit. Every policy or an error.
func (f EnvoyConfig) Policies() ([]*Policy, error) {
	if f.Domain == "" {
		return nil, fmt.Errorf("%w: envoy ratelimit config: field %q is required", ErrInvalidPolicy, "domain")
	}
	var out []*Policy
	seen := map[string]bool{}
	var walk func(path []EnvoyEntry, ds []EnvoyDescriptor) error
	walk = func(path []EnvoyEntry, ds []EnvoyDescriptor) error {
		for _, d := range ds {
			if d.Key == "" {
				return fmt.Errorf("%w: envoy ratelimit config, domain %s: a descriptor under %s has no key",
					ErrInvalidPolicy, f.Domain, pathString(path))
			}
			here := append(append([]EnvoyEntry(nil), path...), EnvoyEntry{Key: d.Key, Value: d.Value})
			if len(here) > MaxIdentityAttributes {
				return fmt.Errorf("%w: envoy ratelimit config: descriptor %s is deeper than %d entries",
					ErrInvalidPolicy, pathString(here), MaxIdentityAttributes)
			}
			if rl := d.RateLimit; rl != nil {
				p, err := envoyPolicy(f, here, d, rl)
				if err != nil {
					return err
				}
				if seen[p.Name] {
					return fmt.Errorf("%w: envoy ratelimit config: two descriptors map to policy %q; name one with "+
						"rate_limit.name", ErrInvalidPolicy, p.Name)
				}
				seen[p.Name] = true
				out = append(out, p)
			}
			if err := walk(here, d.Descriptors); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(nil, f.Descriptors); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: envoy ratelimit config, domain %s: no descriptor has a rate_limit",
			ErrInvalidPolicy, f.Domain)
	}
	return out, nil
}

func envoyPolicy(f EnvoyConfig, path []EnvoyEntry, d EnvoyDescriptor, rl *EnvoyRateLimit) (*Policy, error) {
	period, ok := envoyUnitPeriods[strings.ToLower(rl.Unit)]
	if rl.Unlimited {
		// A placeholder limit; its name and replaces stay (an unlimited
		// limit replaces others too, as in envoyproxy/ratelimit).
		period, ok, rl = time.Second, true, &EnvoyRateLimit{Name: rl.Name, RequestsPerUnit: 1, Replaces: rl.Replaces}
	}
	if !ok {
		return nil, fmt.Errorf("%w: envoy ratelimit config: descriptor %s: unit %s; use second, minute, hour, "+
			"day, week, month or year", ErrInvalidPolicy, pathString(path), QuoteName(rl.Unit))
	}
	name := rl.Name
	if name == "" {
		name = envoyPolicyName(f.Domain, path)
	}
	p := &Policy{
		Name:       name,
		Algorithm:  f.Algorithm,
		Limit:      float64(rl.RequestsPerUnit),
		Period:     Duration(period),
		Scope:      f.Scope,
		ShadowMode: d.ShadowMode,
		Returns:    d.Returns,
		PostHoc:    f.postHoc(d.Returns),
		Envoy: &EnvoyMatch{
			Domain:    f.Domain,
			Entries:   path,
			Unlimited: d.RateLimit.Unlimited,
			Name:      rl.Name,
			QuotaMode: d.QuotaMode,
		},
	}
	if p.Envoy.Unlimited {
		p.Scope = ScopeRegion
	} else if f.Edge != nil {
		e := *f.Edge
		p.Edge = &e
	}
	if p.Algorithm == "" {
		p.Algorithm = FixedWindow
	}
	if p.PostHoc {
		p.MaxCost, p.MaxInFlight = f.MaxCost, f.MaxInFlight
	}
	seen := map[string]bool{}
	for _, e := range path {
		if a := EnvoyAttribute(e.Key); !seen[a] {
			seen[a] = true
			p.Identity = append(p.Identity, a)
		}
	}
	for _, r := range rl.Replaces {
		p.Envoy.Replaces = append(p.Envoy.Replaces, r.Name)
	}
	p.Normalize()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("envoy ratelimit config: descriptor %s: %w", pathString(path), err)
	}
	return p, nil
}

// envoyPolicyName derives a policy name from the domain and the path,
// e.g. mongo_cps.database_users; a name too long or not a valid policy
// name is shortened with a hash.
func envoyPolicyName(domain string, path []EnvoyEntry) string {
	parts := []string{domain}
	for _, e := range path {
		if e.Value != "" {
			parts = append(parts, e.Key+"_"+e.Value)
		} else {
			parts = append(parts, e.Key)
		}
	}
	raw := strings.Join(parts, ".")
	name := strings.TrimLeft(nameChars(raw), "._-")
	if name != raw || len(name) > 63 || name == "" {
		sum := sha256.Sum256([]byte(raw))
		name = strings.Trim(name[:min(len(name), 50)], "._-") + "-" + hex.EncodeToString(sum[:])[:8]
		name = strings.TrimLeft(name, "._-")
	}
	return name
}

// nameChars lower-cases s and makes every character but a-z, 0-9, '_',
// '.' and '-' an '_': what attribute and policy names may hold.
func nameChars(s string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func pathString(path []EnvoyEntry) string {
	if len(path) == 0 {
		return "(top)"
	}
	var parts []string
	for _, e := range path {
		if e.Value != "" {
			parts = append(parts, e.Key+"="+e.Value)
		} else {
			parts = append(parts, e.Key)
		}
	}
	return strings.Join(parts, ",")
}

// EnvoyLimitName is the name envoyproxy/ratelimit knows p's limit by: the
// descriptor's configured rate_limit.name, or "" where the configuration
// names none (or p is not from such a configuration). A policy stored
// before EnvoyMatch.Name was kept has its configured name as its own name
// wherever that differs from the one generated from its path.
func (p *Policy) EnvoyLimitName() string {
	switch {
	case p.Envoy == nil:
		return ""
	case p.Envoy.Name != "":
		return p.Envoy.Name
	case p.Name != envoyPolicyName(p.Envoy.Domain, p.Envoy.Entries):
		return p.Name
	}
	return ""
}
