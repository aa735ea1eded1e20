// Package allocation splits a quota's total amount into regional shares.
// Everything here is a pure function over integers (the quota's fixed-point
// amount), so it can be tested exhaustively and driven by the simulator.
//
// Three strategies compute an ideal split: StrategyStatic (by weight),
// StrategyDemand (by demand) and StrategyMaxMinFair (water-filling). All
// give every region at least its floor, never hand out more than the
// total, and when total demand fits, meet every region's demand and spread
// the surplus by weight (capacity a region may grow into instead of
// stranded). Damp then moves
// the current targets toward the ideal slowly: at most MaxStep per round,
// ignoring changes under Hysteresis.
//
// The shares here are targets. Whether a region may be granted its target
// now depends on what the others may still be enforcing; lease.Book decides
// that.
package allocation
