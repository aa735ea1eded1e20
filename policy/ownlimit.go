package policy

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidOwnLimit reports a request's own limit (OwnLimit) that
// cannot be enforced: a window longer than MaxWindowMs, not a whole
// number of milliseconds, or a negative limit.
var ErrInvalidOwnLimit = errors.New("invalid request limit")

// OwnLimit is a limit a request carries itself instead of the one its
// policy sets: Envoy's descriptor limit override
// (RateLimitDescriptor.RateLimitOverride), which Envoy fills from route
// metadata or statically. It is Limit requests per Period on a fixed
// window, as envoyproxy/ratelimit enforces an override (a Limit above
// MaxCapacity is taken as MaxCapacity, practically unlimited). The own
// limit of a global policy is enforced in each region as the fraction of
// it the region's lease gives of the policy (admission); a region-scoped
// policy's whole. A Limit of 0 admits nothing.
type OwnLimit struct {
	Limit  int64
	Period Duration
}

// Validate reports, wrapping ErrInvalidOwnLimit, why o cannot be
// enforced, or nil. A Limit of 0 is valid: it admits no request.
func (o OwnLimit) Validate() error {
	d := time.Duration(o.Period)
	switch {
	case d <= 0 || d.Milliseconds() > MaxWindowMs || d%time.Millisecond != 0:
		return fmt.Errorf("%w: period %s; windows are whole milliseconds up to %s",
			ErrInvalidOwnLimit, d, time.Duration(MaxWindowMs)*time.Millisecond)
	case o.Limit < 0:
		return fmt.Errorf("%w: limit %d is negative", ErrInvalidOwnLimit, o.Limit)
	}
	return nil
}

// UnderOwnLimit returns the policy a request of p with its own limit o
// (valid) counts under: p's identity and shards, o's limit and window on
// a fixed window, region scope (admission puts a global p's under the
// region's lease fraction), not in shadow mode and tied to no Envoy
// descriptor (an override has no name, no replaces, no quota mode, as in
// envoyproxy/ratelimit, src/config/config_impl.go, GetLimit).
//
// Where p is itself a fixed window of o's period the result keeps p's
// name and version, so the request counts in p's own counter: as in
// envoyproxy/ratelimit, whose counter key is the domain, the descriptor's
// entries and the window (src/limiter/cache_key.go), an override with the
// configured limit's unit shares that limit's counter. Otherwise its name
// is p's with the period after a '~' (a character no policy name has),
// so it has its own counter, one per identity and period.
func (p *Policy) UnderOwnLimit(o OwnLimit) *Policy {
	q := *p
	q.Algorithm, q.Limit, q.Period, q.Burst = FixedWindow, float64(min(o.Limit, MaxCapacity/Micro)), o.Period, 0
	q.Scope, q.ShadowMode, q.Envoy = ScopeRegion, false, nil
	q.Floors, q.IdentityShares = nil, nil // global policies' settings
	if p.Algorithm != FixedWindow || p.Period != o.Period {
		q.Name = p.Name + "~" + time.Duration(o.Period).String()
	}
	return &q
}
