// Package policy is the pure model of a rate limit: what an operator writes
// (Policy, its Failure mode, parsed from YAML or from an envoyproxy/ratelimit
// configuration), the fixed-point Limits it enforces and the shares of them
// a region may be granted (Limits.Amount, Limits.Share), whom a request
// counts against (Policy.IdentityOf), and every algorithm's transition as a
// pure function on injected time (Apply, Fresh, LocalBudget).
//
// It links no I/O library. The regional engine runs the same arithmetic in
// Lua on Redis, and tests demand identical answers from both; the lease
// book, the bound and the simulator use it as production does.
//
// All quantities are fixed point: quota in integer micro-units (Micro: one
// request of cost 1 is 1,000,000 micro-units) and time in integer
// milliseconds.
package policy
