package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"regexp"
	"time"

	"github.com/quota-lease/quota-lease/scale"
)

// Policy is one rate limit as an operator writes it: whom it counts
// (identity), how (algorithm, limit, period, burst), where (global or
// region-local) and what a region does when it cannot renew its lease.
type Policy struct {
	// Name identifies the policy in requests, keys and metrics.
	Name string `yaml:"name" json:"name"`
	// Version is the configuration version. Keys carry it, so a policy
	// whose limits change under a new version starts from fresh state.
	Version int64 `yaml:"version" json:"version"`
	// Identity lists the request attributes whose values, together, name
	// the counted subject: for example [tenant] or [tenant, route].
	Identity []string `yaml:"identity" json:"identity"`
	// Algorithm defaults to token_bucket.
	Algorithm Algorithm `yaml:"algorithm" json:"algorithm"`
	// Limit is how many units are admitted per Period: the refill of a
	// token bucket, or the limit of one window.
	Limit float64 `yaml:"limit" json:"limit"`
	// Period is the time Limit refers to, and the window length of the
	// window algorithms.
	Period Duration `yaml:"period" json:"period"`
	// Burst is a token bucket's capacity; it defaults to Limit. Window
	// algorithms have no burst beyond their limit.
	Burst float64 `yaml:"burst,omitempty" json:"burst,omitempty"`
	// Cost is the default cost of a request whose caller names none.
	Cost int64 `yaml:"cost,omitempty" json:"cost,omitempty"`
	// Envoy, when set, ties the policy to a descriptor of an
	// envoyproxy/ratelimit configuration (ParseEnvoyConfig): Envoy
	// requests in its domain match it by their descriptor's entries.
	Envoy *EnvoyMatch `yaml:"envoy,omitempty" json:"envoy,omitempty"`
	// ShadowMode decides and counts every check as usual but admits
	// everything: a rejection is reported as a shadow one (metrics, the
	// check's answer), so a new limit can be watched before it is enforced.
	ShadowMode bool `yaml:"shadow_mode,omitempty" json:"shadow_mode,omitempty"`
	// Scope is global (one limit shared by all regions through leases) or
	// region (every region enforces the full limit on its own).
	Scope Scope `yaml:"scope,omitempty" json:"scope,omitempty"`
	// Failure is what a region enforces when its lease cannot be renewed.
	Failure Failure `yaml:"failure,omitempty" json:"failure,omitempty"`
	// Floors are the least share of Limit (units per Period) a region gets
	// whatever the demand elsewhere, by region name. They must sum to at
	// most Limit. Global policies only.
	Floors map[string]float64 `yaml:"floors,omitempty" json:"floors,omitempty"`
	// Shards, above 1, splits every identity's limits in a region into
	// that many equal parts, each on a Redis key of its own in its own
	// hash slot, and spreads the identity's checks over them in turn: one
	// hot identity then loads that many Redis Cluster shards instead of
	// one. The parts add up to no more than the whole (ShardLimits), so
	// splitting never admits more; it may reject a request one part
	// cannot hold while another still could. 0 and 1 mean one key.
	Shards int `yaml:"shards,omitempty" json:"shards,omitempty"`
	// IdentityShares is the most identities that may hold shares of their
	// own at once (docs/identity-shares.md): an identity whose demand lives
	// in few regions gets its limit where it lives instead of every region's
	// default share. Unset: DefaultIdentityShares; 0: none. Global policies
	// only.
	IdentityShares *int `yaml:"identity_shares,omitempty" json:"identity_shares,omitempty"`
	// Returns declares that the policy's requests give back what they
	// took when they end (Envoy's is_negative_hits; docs/envoy.md): a
	// concurrency-style use, where a returned unit is one whose request
	// is over and counts as never admitted. Only such a policy accepts a
	// return (Return); its limit then bounds the units taken and not yet
	// returned, and the bound holds for those (docs/bound.md). A return
	// to any other policy is refused: there a return would admit more
	// requests than the limit.
	Returns bool `yaml:"returns,omitempty" json:"returns,omitempty"`
	// PostHoc declares that the policy takes charges after the fact: a
	// request whose cost is known only when it ends (an LLM's tokens) is
	// checked when it starts (a charge of 0: admitted while the identity
	// is within its limit) and charged when it ends, and that charge is
	// counted whether or not it fits (Limits.PostHoc), as
	// envoyproxy/ratelimit counts every hit: a window goes over its limit,
	// a token bucket into debt, and checks are refused until it is repaid
	// (docs/post-hoc.md). On by default for policies from an
	// envoyproxy/ratelimit configuration. Not with Returns.
	PostHoc bool `yaml:"post_hoc,omitempty" json:"post_hoc,omitempty"`
	// MaxCost and MaxInFlight size a post-hoc policy's overshoot for the
	// bound (docs/bound.md, "Charges after the fact"): the largest cost one
	// request is charged, in units, and the most requests of one identity,
	// across all regions, admitted by a check and not yet charged at once.
	// What checks admit while the identity is within its limit is charged
	// later, so the identity can be charged up to MaxInFlight × MaxCost
	// beyond its limit. 0: not declared, and the bound cannot say.
	MaxCost     int64 `yaml:"max_cost,omitempty" json:"max_cost,omitempty"`
	MaxInFlight int64 `yaml:"max_in_flight,omitempty" json:"max_in_flight,omitempty"`
	// Edge, when set, serves the policy to Envoy's Rate Limit Quota
	// Service (docs/rlqs.md): Envoy instances enforce token-bucket
	// assignments carved out of the region's share. Global policies only.
	Edge *Edge `yaml:"edge,omitempty" json:"edge,omitempty"`
}

// DefaultIdentityShares is the most identity shares a global policy has
// when it does not say.
const DefaultIdentityShares = 1000

// MaxIdentityShares is the most identity shares a policy may ask for.
const MaxIdentityShares = 100_000

// IdentityShareLimit is the most identities of p that may hold shares of
// their own at once.
func (p *Policy) IdentityShareLimit() int {
	if p.IdentityShares == nil {
		return DefaultIdentityShares
	}
	return *p.IdentityShares
}

// Scope says whether a policy's limit is shared across regions.
type Scope string

// The scopes a policy can have.
const (
	// ScopeGlobal shares one limit across all regions through leases.
	ScopeGlobal Scope = "global"
	// ScopeRegion applies the full limit in every region independently.
	ScopeRegion Scope = "region"
)

// FailureMode names what a region enforces when its lease lapsed.
type FailureMode string

// The failure modes; see docs/failure-modes.md.
const (
	// FailClosed admits nothing until the lease is renewed.
	FailClosed FailureMode = "fail-closed"
	// StaticShare enforces StaticFraction of the global limit, which the
	// coordinator keeps reserved for the region.
	StaticShare FailureMode = "static-share"
	// LastLease keeps the last granted share, decaying linearly over Decay
	// to StaticFraction.
	LastLease FailureMode = "last-lease"
	// FailOpen enforces OpenFraction of the global limit locally: bounded,
	// but not reserved, so the global limit may be exceeded by it.
	FailOpen FailureMode = "fail-open"
)

// Failure is a policy's degraded budget.
type Failure struct {
	// Mode defaults to fail-closed, the only mode with no overshoot and
	// nothing to reserve.
	Mode FailureMode `yaml:"mode" json:"mode"`
	// StaticFraction of the global limit a degraded region enforces
	// (static-share), or decays to (last-lease). In [0, 1].
	StaticFraction float64 `yaml:"static_fraction,omitempty" json:"static_fraction,omitempty"`
	// Decay is how long last-lease takes to fall to StaticFraction.
	Decay Duration `yaml:"decay,omitempty" json:"decay,omitempty"`
	// OpenFraction of the global limit a fail-open region may admit on its
	// own. In (0, 1].
	OpenFraction float64 `yaml:"open_fraction,omitempty" json:"open_fraction,omitempty"`
	// FallbackStart is the fraction, in [0, 1], of its local fallback
	// budget an identity starts with when an agent first has to decide it
	// without Redis (slow or down). The default 0 starts it empty and lets
	// it refill at the budget's rate: the agent cannot know what Redis
	// already admitted, so a full start would mint a burst per agent.
	FallbackStart float64 `yaml:"fallback_start,omitempty" json:"fallback_start,omitempty"`
}

// ErrInvalidPolicy is wrapped by every policy validation error.
var ErrInvalidPolicy = errors.New("invalid policy")

var (
	policyNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	// RegionNameRE is what a region name looks like: us-east-1, eu, ap-south.
	RegionNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	attributeRE  = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,31}$`)
)

// ValidName says whether s can name a policy: 1-63 characters of a-z, 0-9,
// '.', '_', '-', starting with a letter or digit.
func ValidName(s string) bool { return policyNameRE.MatchString(s) }

// MaxIdentityAttributes is how many attributes a composite identity may use.
const MaxIdentityAttributes = 8

// MaxShards is the most parts a policy may split an identity's limits into.
const MaxShards = 64

// DefaultDecay is the last-lease decay when a policy names none.
const DefaultDecay = time.Minute

// Normalize fills in the defaults of fields left empty: algorithm, burst,
// cost, scope, failure mode and decay. It does not validate.
func (p *Policy) Normalize() {
	if p.Algorithm == "" {
		p.Algorithm = TokenBucket
	}
	if p.Burst == 0 && p.Algorithm == TokenBucket {
		p.Burst = p.Limit
	}
	if p.Cost == 0 {
		p.Cost = 1
	}
	if p.Scope == "" {
		p.Scope = ScopeGlobal
	}
	if p.Failure.Mode == "" {
		p.Failure.Mode = FailClosed
	}
	if p.Failure.Mode == LastLease && p.Failure.Decay == 0 {
		p.Failure.Decay = Duration(DefaultDecay)
	}
}

// Validate checks a normalized policy and returns an error naming the
// first offending field and what to write instead.
func (p *Policy) Validate() error {
	name := p.Name
	if name == "" {
		name = "(unnamed)"
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w %s: field %q: %s", ErrInvalidPolicy, QuoteName(name), field, fmt.Sprintf(format, args...))
	}
	if e := p.Envoy; e != nil {
		if e.Domain == "" || len(e.Entries) == 0 || len(e.Entries) > MaxIdentityAttributes {
			return bad("envoy", "needs a domain and 1-%d descriptor entries", MaxIdentityAttributes)
		}
		for _, en := range e.Entries {
			if en.Key == "" {
				return bad("envoy", "a descriptor entry has no key")
			}
		}
	}
	if !ValidName(p.Name) {
		return bad("name", "must be 1-63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
	}
	if p.Version < 0 {
		return bad("version", "must be zero or positive, got %d", p.Version)
	}
	if len(p.Identity) == 0 || len(p.Identity) > MaxIdentityAttributes {
		return bad("identity", "must list 1 to %d request attributes, e.g. [tenant] or [tenant, route]",
			MaxIdentityAttributes)
	}
	if err := p.validateIdentity(); err != nil {
		return bad(err.field, "%s", err.msg)
	}
	if !finitePositive(p.Limit) {
		return bad("limit", "must be a positive finite number, got %v", p.Limit)
	}
	if p.Period <= 0 || time.Duration(p.Period)%time.Millisecond != 0 {
		return bad("period", "must be a positive whole number of milliseconds, e.g. 1s or 1m, got %s", p.Period)
	}
	switch p.Algorithm {
	case TokenBucket:
		if !finitePositive(p.Burst) {
			return bad("burst", "must be a positive finite number, got %v", p.Burst)
		}
	case FixedWindow, SlidingWindow, SlidingLog:
		if p.Burst != 0 {
			return bad("burst", "applies only to token_bucket; a window's burst is its limit")
		}
		if p.Limit != math.Trunc(p.Limit) {
			return bad("limit", "must be a whole number for %s, got %v", p.Algorithm, p.Limit)
		}
	default:
		return bad("algorithm", "unknown %s; use token_bucket, fixed_window, sliding_window or sliding_log",
			QuoteName(string(p.Algorithm)))
	}
	if p.Cost < 1 {
		return bad("cost", "must be a positive whole number, got %d", p.Cost)
	}
	if p.Scope != ScopeGlobal && p.Scope != ScopeRegion {
		return bad("scope", "unknown %s; use global or region", QuoteName(string(p.Scope)))
	}
	if err := p.validateSplit(); err != nil {
		return bad(err.field, "%s", err.msg)
	}
	if err := p.Failure.validate(); err != nil {
		return bad("failure."+err.field, "%s", err.msg)
	}
	if p.Edge != nil {
		if p.Scope == ScopeRegion {
			return bad("edge", "applies only to global policies: a region-scoped policy's checks do not consult "+
				"the region's share, so they could not leave the edge its part")
		}
		if err := p.Edge.validate(); err != nil {
			return bad("edge."+err.field, "%s", err.msg)
		}
	}
	l, err := p.limits()
	if err != nil {
		return bad("limit", "%v", err)
	}
	if p.Cost > l.Capacity/Micro { // not p.Cost*Micro, which overflows
		return bad("cost", "default cost %d exceeds the capacity %v: no request could be admitted", p.Cost, Units(l.Capacity))
	}
	if p.Shards < 0 || p.Shards > MaxShards {
		return bad("shards", "must be 0 to %d, got %d", MaxShards, p.Shards)
	}
	if p.Returns && p.ShardCount() > 1 {
		return bad("returns", "a policy with shards cannot take returns: a return would meet a shard other than "+
			"the one its request took from; use one shard")
	}
	if err := p.validatePostHoc(); err != nil {
		return bad(err.field, "%s", err.msg)
	}
	if sl := p.ShardLimits(l); sl.Validate() != nil || p.Cost > sl.Capacity/Micro {
		return bad("shards", "%d shards leave each a capacity of %v, which cannot hold the default cost %d; use "+
			"fewer shards", p.Shards, Units(sl.Capacity), p.Cost)
	}
	return nil
}

// StartsFresh reports whether changing a policy from prev to next starts
// keys from fresh state, which grants a burst the bound must count: a new
// version renames every key, and a new shard count adds keys of shards
// that did not exist.
func StartsFresh(prev, next *Policy) bool {
	return prev.Version != next.Version || prev.ShardCount() != next.ShardCount()
}

// ShardCount is how many parts the policy splits an identity's limits
// into: Shards, or 1.
func (p *Policy) ShardCount() int64 {
	return max(1, int64(p.Shards))
}

// ShardLimits returns the limits one shard of an identity enforces when
// the identity's limits are l (the full limits, or a region's share):
// l split into ShardCount equal parts, rounded down (Limits.Scale), so the
// parts never add up to more than l. This is the one place that rule is
// written.
func (p *Policy) ShardLimits(l Limits) Limits {
	if n := p.ShardCount(); n > 1 {
		return l.Scale(1, n)
	}
	return l
}

type fieldError struct{ field, msg string }

// MaxInFlight is the most requests in flight a post-hoc policy may declare.
const MaxInFlight = 1_000_000

// validateIdentity checks the attributes an identity is made of.
func (p *Policy) validateIdentity() *fieldError {
	seen := make(map[string]bool, len(p.Identity))
	for _, a := range p.Identity {
		if !attributeRE.MatchString(a) {
			return &fieldError{"identity", fmt.Sprintf("attribute %s must be 1-32 characters of a-z, 0-9, '_', "+
				"'.', '-', starting with a letter", QuoteName(a))}
		}
		if seen[a] {
			return &fieldError{"identity", fmt.Sprintf("attribute %s is listed twice", QuoteName(a))}
		}
		seen[a] = true
	}
	return nil
}

// validateSplit checks how the policy's limit is split between regions:
// its floors and its identity shares.
func (p *Policy) validateSplit() *fieldError {
	var floors float64
	for region, f := range p.Floors {
		if !RegionNameRE.MatchString(region) {
			return &fieldError{"floors", fmt.Sprintf("region name %s must be 1-63 characters of a-z, 0-9 and '-'",
				QuoteName(region))}
		}
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return &fieldError{"floors", fmt.Sprintf("floor of region %q must be a finite number >= 0, got %v", region, f)}
		}
		floors += f
	}
	switch {
	case floors > p.Limit:
		return &fieldError{"floors", fmt.Sprintf("the quota (limit %v) is below the sum of the regions' floors "+
			"(%v); lower the floors or raise the limit", p.Limit, floors)}
	case p.IdentityShares != nil && (*p.IdentityShares < 0 || *p.IdentityShares > MaxIdentityShares):
		return &fieldError{"identity_shares", fmt.Sprintf("must be 0 to %d, got %d", MaxIdentityShares, *p.IdentityShares)}
	case p.IdentityShares != nil && p.Scope == ScopeRegion:
		return &fieldError{"identity_shares", "apply only to global policies; a region-scoped policy is not split"}
	case len(p.Floors) > 0 && p.Scope == ScopeRegion:
		return &fieldError{"floors", "apply only to global policies; a region-scoped policy is not split"}
	}
	return nil
}

// validatePostHoc checks the settings of charges after the fact.
func (p *Policy) validatePostHoc() *fieldError {
	switch {
	case p.PostHoc && p.Returns:
		return &fieldError{"post_hoc",
			"a policy that takes returns (a concurrency limit) cannot take charges after the fact; use one or the " +
				"other"}
	case !p.PostHoc && (p.MaxCost != 0 || p.MaxInFlight != 0):
		return &fieldError{"max_cost",
			"max_cost and max_in_flight size charges after the fact; set post_hoc: true or remove them"}
	case p.MaxCost < 0 || p.MaxCost > MaxCapacity/Micro:
		return &fieldError{"max_cost", fmt.Sprintf("must be 0 (not declared) to %d units, got %d",
			MaxCapacity/Micro, p.MaxCost)}
	case p.MaxInFlight < 0 || p.MaxInFlight > MaxInFlight:
		return &fieldError{"max_in_flight", fmt.Sprintf("must be 0 (not declared) to %d requests, got %d",
			MaxInFlight, p.MaxInFlight)}
	}
	return nil
}

func (f Failure) validate() *fieldError {
	fraction := func(field, of string, v float64, allowZero bool) *fieldError {
		if math.IsNaN(v) || v < 0 || v > 1 || (!allowZero && v == 0) {
			lo := "[0, 1]"
			if !allowZero {
				lo = "(0, 1]"
			}
			return &fieldError{field, fmt.Sprintf("must be a fraction in %s of %s, got %v", lo, of, v)}
		}
		return nil
	}
	if e := fraction("fallback_start", "the local fallback budget", f.FallbackStart, true); e != nil {
		return e
	}
	switch f.Mode {
	case FailClosed:
	case StaticShare:
		return fraction("static_fraction", "the global limit", f.StaticFraction, true)
	case LastLease:
		if f.Decay <= 0 {
			return &fieldError{"decay", fmt.Sprintf("must be positive, got %s", f.Decay)}
		}
		return fraction("static_fraction", "the global limit", f.StaticFraction, true)
	case FailOpen:
		return fraction("open_fraction", "the global limit", f.OpenFraction, false)
	default:
		return &fieldError{"mode", fmt.Sprintf("unknown %s; use fail-closed, static-share, last-lease or "+
			"fail-open", QuoteName(string(f.Mode)))}
	}
	return nil
}

func finitePositive(v float64) bool { return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }

// Fingerprint identifies the policy's exact content: a 64-bit FNV-1a hash
// of its JSON form, which lists every field in a fixed order. Any change,
// with or without a new Version, changes it (up to hash collisions).
func (p *Policy) Fingerprint() uint64 {
	b, err := json.Marshal(p)
	if err != nil { // a Policy of plain fields always marshals
		panic(fmt.Sprintf("policy %q: %v", p.Name, err))
	}
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// Limits returns the fixed-point limits of the policy's full (global)
// limit. The policy must be valid.
func (p *Policy) Limits() Limits {
	l, _ := p.limits()
	return l
}

func (p *Policy) limits() (Limits, error) {
	periodMs := time.Duration(p.Period).Milliseconds()
	limit, ok := toMicro(p.Limit)
	if !ok {
		return Limits{}, fmt.Errorf("%v is too large", p.Limit)
	}
	l := Limits{Algorithm: p.Algorithm, PostHoc: p.PostHoc}
	if p.Algorithm == TokenBucket {
		burst, ok := toMicro(p.Burst)
		if !ok {
			return Limits{}, fmt.Errorf("burst %v is too large", p.Burst)
		}
		l.Capacity = burst
		// micro-units per second, rounded down: never faster than written.
		l.Rate = scale.Down(limit, 1000, periodMs)
	} else {
		l.Capacity = limit
		l.WindowMs = periodMs
	}
	if err := l.Validate(); err != nil {
		return Limits{}, err
	}
	return l, nil
}

// toMicro converts a count of units to micro-units, rounding to the nearest
// micro-unit so that decimal inputs such as 0.1 convert exactly.
func toMicro(v float64) (int64, bool) {
	m := math.Round(v * float64(Micro))
	if m > float64(MaxCapacity) || m < 0 {
		return 0, false
	}
	return int64(m), true
}
