// Package edge is the pure logic of leases to the edge: the agent serving
// Envoy's Rate Limit Quota Service (RLQS), where each Envoy instance
// enforces a token bucket the agent assigned it for a time to live. An
// assignment is a lease one level below the region's, so the rules are the
// lease protocol's (docs/rlqs-server.md derives them):
//
//   - a slot's token bucket, sized by package edge/tokens so that it
//     admits in any window no more than the instance's share admits in
//     the same window. With Envoy's fill-ratio rule (a replaced bucket
//     keeps its fill) tokens.Resize sizes it up to the share's burst and
//     adds tokens only as far as a virtual bucket of the share has room
//     (the slot's slack, slack.go); for older Envoy, which may start a
//     replaced bucket full, tokens.Assign sizes it for a start at every
//     change;
//   - TTL and Lifetime: whole seconds that never outlast the region's
//     grant, and how long the agent must count an assignment it sent;
//   - Target and Split: the region's capacity between direct checks and
//     the agents serving the edge, and an agent's part among its Envoy
//     instances, by demand (package allocation);
//   - Ledger: the two phases. An assignment that grows waits until the
//     region's reservation covers it and every agent could see that; an
//     assignment that shrinks is pushed at once but keeps counting until
//     it expires;
//   - instance places (places.go): at most the policy's instances per
//     region hold an assignment, whichever agents they connect to.
//
// The package links no I/O library; the agent's RLQS server
// (internal/agent/rlqs) puts it on the wire, and package regional in
// Redis.
package edge
