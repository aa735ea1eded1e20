// Package envoy is what Envoy's rate limit quota filter
// (envoy.filters.http.rate_limit_quota) does with one bucket, in plain Go:
// how it decides a request, applies an assignment (a token bucket kept,
// started from the old one's fill ratio, or full), expires it into the
// configured fallback and then the no-assignment behaviour, and what a
// usage report of it holds. It was read from Envoy's source
// (source/extensions/filters/http/rate_limit_quota/: filter.cc,
// global_client_impl.cc, quota_bucket_cache.h; the token bucket is
// AtomicTokenBucketImpl, PR #37624 for a replacement's start);
// docs/rlqs.md says what Envoy does, and internal/testenv/rlqsenvoy's
// doc names the commits.
//
// Two programs run it: the client library (quotalease, and through it
// the Envoy-like test client internal/testenv/rlqsenvoy) on the wire,
// converting Envoy's protos into Strategy, and the simulator (sim) on
// virtual time, so both play the same Envoy. Where Envoy's implementation departs from the API's comments,
// this package does what the implementation does: time to live and
// fallback timeouts in whole seconds (under one second an assignment
// expires at once), fill intervals truncated to whole seconds (under one
// second the bucket is always full), requests_per_time_unit ignored as an
// assignment, an expired bucket never abandoned.
//
// Time is the caller's monotonic clock as a time.Duration. Timers are
// applied lazily: Settle runs, at the instant each fell due, the expiries
// Envoy's timers would have run by now. The package links no I/O library.
package envoy
