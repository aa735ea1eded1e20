// Package allocation holds the pure functions that split a global quota
// into regional shares (static weights, demand-proportional, max-min fair)
// with damped rebalancing. It does no I/O.
package allocation
