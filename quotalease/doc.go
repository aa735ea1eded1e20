// Package quotalease decides a Go service's requests in-process against a
// global, multi-region quota-lease limit: no call per request, and the
// overshoot still the number the system publishes.
//
// A Client holds one RLQS stream (Envoy's Rate Limit Quota Service) to the
// region's regional agents, exactly as an Envoy with the rate limit quota
// filter does. It reports each bucket's usage; the agent assigns each
// bucket a token bucket carved out of the region's leased share of the
// policy; the client decides every request on it, in memory:
//
//	c, err := quotalease.New(ctx, quotalease.Config{
//		Agents:      []string{"agent-1.us:7500", "agent-2.us:7500"},
//		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(creds)},
//		Domain:      "shop",
//		Buckets:     envoy.SettingsOf(policy.Edge), // what the policy states
//	})
//	...
//	if !c.Allow(map[string]string{"policy": "api-per-tenant", "tenant": tenant}) {
//		// 429
//	}
//
// A bucket is the map the agent's policies match, as a BucketId built by
// Envoy's bucket matchers would be: a "policy" entry naming a quota-lease
// policy with edge settings, and that policy's identity attributes. A
// caller deciding many requests of one bucket can hold a handle on it
// (Client.Bucket), whose decisions skip building the bucket's key.
//
// # What it does as Envoy does
//
// The decisions are package edge/envoy's, the rules read from Envoy's
// filter, which the simulator and the end-to-end tests run too: a bucket's
// first request is decided by its no-assignment behaviour and reported at
// once; an assigned token bucket that changes starts at the old one's fill
// ratio; an assignment expires after its time to live into the expired
// fallback and then the no-assignment behaviour; an abandon forgets the
// bucket. Each client counts as one instance in the policy's
// edge.instances, and its no-assignment and expired behaviours are the
// bound's edge term, as for Envoy (docs/bound.md), so Config.Buckets
// should be what the policy states.
//
// # What it does better than Envoy
//
//   - Reports go out every ReportInterval (1 s by default; Envoy
//     hard-codes 5 s), so the agent follows demand sooner.
//   - A stream that breaks is opened again after 100 ms, rather than at
//     the next report; one an agent refuses (at its most streams,
//     draining) moves to the next agent, the wait doubling; an agent that
//     stops answering without closing is found by keepalive pings (every
//     10 s, 5 s to answer).
//   - A bucket unused for ForgetAfter (5 minutes) is forgotten instead of
//     reported forever.
//   - A report says the time it covers to the nanosecond (Envoy: whole
//     seconds), so the agent reads each bucket's rate exactly, whatever
//     delays the report.
//   - A request may cost more than one unit (AllowN).
//
// # Middleware
//
// Client.Middleware wraps a net/http handler; a refused request gets the
// agent's HTTP API answer: 429, application/problem+json naming the
// policy, Retry-After, and the RateLimit fields of the same draft version
// setting. Client.UnaryInterceptor and Client.StreamInterceptor refuse a
// gRPC call with ResourceExhausted and a RetryInfo.
package quotalease
