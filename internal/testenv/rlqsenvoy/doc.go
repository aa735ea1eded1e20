// Package rlqsenvoy plays Envoy's HTTP rate limit quota filter
// (envoy.filters.http.rate_limit_quota) against an RLQS server, for tests
// and benchmarks: there is no Envoy binary here, so the quota-lease RLQS
// server is tested against this client instead, and this client is written
// from Envoy's own source, behaviour for behaviour. Many Instances run in
// one process; each is one Envoy with one stream.
//
// An Instance is the client library (package quotalease) run with Envoy's
// settings and behaviours: the bucket settings read from Envoy's proto,
// its report interval, a stream reopened only with the next report,
// buckets kept until the server abandons them. It pings the server as the
// library does (every 10 s), where an Envoy pings as its cluster's
// keepalive says (docs/rlqs.md has it ping every 5 s). What this package
// adds is Envoy's configuration and each instance's own records.
//
// Read from envoyproxy/envoy, source/extensions/filters/http/rate_limit_quota/:
//   - filter.cc (commit 1736899111be41f7567a2c4a16af886291db8151): the
//     request path. A request of a bucket the cache lacks is decided by
//     no_assignment_behavior (denied only by a DENY_ALL blanket rule) and
//     creates the bucket; later requests follow the cached assignment, or
//     the default action when there is none (shouldAllowRequest).
//   - global_client_impl.cc (commit c33e7f824b9946853a80e839d6e80ef2a09f3bb4)
//     and global_client_impl.h (8e0b7e59e10b767bebfcedb164d425146f75c8d8):
//     the first bucket starts the report timer and the stream; each new
//     bucket is reported at once, alone; every timer tick reports every
//     bucket (counts since the last report, then reset; time_elapsed in
//     whole seconds), restarting the stream first if it is down; responses
//     replace a bucket's assignment (token buckets kept when unchanged,
//     otherwise started from the old bucket's fill ratio, or full),
//     requests_per_time_unit is ignored, abandon erases the bucket; TTL
//     and fallback timers (whole seconds) move an expired bucket to the
//     expired_assignment_behavior fallback and then to the default action.
//   - quota_bucket_cache.h (the CachedBucket version): what a bucket holds.
//   - filter_persistence.cc (commit 93e15bfadb68f6b98ebe422d6f73205c3d532970):
//     one client and stream per (server, domain); the report interval is a
//     hard-coded 5 s, whatever reporting_interval says.
//   - matcher.cc (commit 3b0bcb125b34a5447f21d6ff10ed6cbdef600da6): how a
//     BucketId is built. Here the caller builds it, as Envoy's bucket
//     matchers would, and passes the map to Allow.
//   - the token bucket: AtomicTokenBucketImpl in
//     source/common/common/token_bucket_impl.{h,cc} (continuous refill,
//     fill rate clamped to at least one token a year) and PR #37624 (a
//     replacement bucket starts at the old one's fill ratio).
//
// Where Envoy's implementation departs from the API's comments, this
// client does what the implementation does: an unset or sub-second
// assignment_time_to_live expires at once; fill intervals are truncated
// to whole seconds (below one second the fill rate is infinite);
// reuse_last_assignment is ignored; an expired bucket is never abandoned.
// One departure from Envoy: a token bucket as no_assignment_behavior makes
// Envoy dereference a null limiter, so New refuses it.
//
// Timers are read lazily from the injected clock (clock.Clock): an
// assignment's expiry and its fallback's are applied, at the instant they
// fell due, by the next request, report or response, which is what Envoy's
// timers would have done by then. Only the report timer runs on real time
// (the clock has no timers); ReportNow fires it on demand.
//
// Each Instance keeps its own records (every admitted request with its
// wall-clock time, per bucket, kept through abandons) for recounts against
// the bound the server published, and counters (Stats).
package rlqsenvoy
