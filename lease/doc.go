// Package lease defines what a grant is and its life on both sides of the
// lease protocol, as pure logic on injected time so that tests and the
// simulator run it on virtual clocks.
//
// A grant gives one region a share of one quota for ValidFor. The agent
// measures that from the moment it sent the request, on its monotonic
// clock, less a drift margin (Timing.AgentValidFor); the coordinator from
// the moment it granted. Since the agent sends before the coordinator
// grants, the agent always stops believing in a grant before the
// coordinator frees its share; only the rate drift of clocks (a configured
// bound) enters that argument, never their offsets.
//
// The agent side is Holder (requested -> active <-> renewing; once a grant
// may have expired, degraded on its failure mode's budget, then expired
// when the degraded timeout has passed). The coordinator side is Book: per quota, what every region may
// currently be enforcing (an unacknowledged old grant, the new grant, or the
// degraded budget of a region whose lease lapsed), and the grants it may
// hand out without that sum exceeding the global limit.
package lease
