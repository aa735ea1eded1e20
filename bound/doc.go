// Package bound computes the overshoot bound: from a policy and the
// deployment parameters, the most the whole system can admit in any window
// of a given length, as named terms that add up to a number.
//
// The reference is what one ideal global limiter with the policy's limits
// would admit at most in such a window. Leasing keeps the sum of what
// regions may be enforcing at or below the global limit at every instant
// (lease.Book), and a region's bucket never holds more than its share's
// capacity, so leasing itself adds nothing to the reference. What it does
// add is named:
//
//	drift            Redis clocks in different regions refill at rates off by up to the drift bound
//	degraded         fail-open budgets of lapsed regions, which are not reserved
//	fallback         in-process fallback buckets during Redis outages start full, and Redis refills meanwhile
//	burst            a config change under a new version starts every key full
//	lease-transition grants at an old, larger total still count after the quota is lowered
//	shards           splitting an identity's limits over shards: always 0, the parts never add up to more
//	window-clock     fixed windows on the Redis clock as agents see it: 0, unless that clock steps back
//	returned         a policy that accepts returns: always 0; the bound counts units admitted and not returned
//	edge             Envoy instances following their own fallback without an assignment (RLQS); +Inf under allow
//
// docs/bound.md derives each term. The simulator compares every observed
// window against this number.
package bound
