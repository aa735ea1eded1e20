package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Lifetime is how long after the agent sends an assignment of time to live
// ttl Envoy may still enforce it, on the agent's clock: Envoy counts ttl
// from when it processes the assignment (within margin of the send: the
// stream's delivery and Envoy's main thread), on its own clock, which may
// run slow against the agent's by up to twice the drift bound.
func Lifetime(ttl time.Duration, drift float64, margin time.Duration) time.Duration {
	return ttl + time.Duration(math.Ceil(2*drift*float64(ttl))) + margin
}

// TTL returns the time to live to send, whole seconds (Envoy reads only
// the seconds, and expires an assignment under 1s at once): want, shortened
// so that its Lifetime ends within validLeft, what is left of the region's
// grant. ok is false when even 1s outlives the grant: the assignment must
// then come from what the region may enforce after its grant (its degraded
// budget), and lasts want.
func TTL(want, validLeft time.Duration, drift float64, margin time.Duration) (ttl time.Duration, ok bool) {
	want = max(time.Second, want.Truncate(time.Second))
	for ttl = want; ttl >= time.Second; ttl -= time.Second {
		if Lifetime(ttl, drift, margin) <= validLeft {
			return ttl, true
		}
	}
	return want, false
}

// SteadyUntil is until when a round of an identity of p gets the same
// time to live and capacity from the region's grant, valid until
// validUntil, as long as that grant stays: while one whole assignment's
// Lifetime still ends within it (TTL shortens nothing, and the capacity at
// the end of that life is the grant's). The zero validUntil (no grant)
// is never steady.
func SteadyUntil(p *policy.Policy, validUntil time.Time, cfg Config) time.Time {
	if validUntil.IsZero() {
		return time.Time{}
	}
	ttl, _ := TTL(p.Edge.EdgeTTL(), time.Duration(math.MaxInt64), cfg.Drift, cfg.Margin)
	return validUntil.Add(-Lifetime(ttl, cfg.Drift, cfg.Margin))
}
