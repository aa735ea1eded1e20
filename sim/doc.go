// Package sim is the region-shift simulator: a deterministic discrete-event
// simulation on virtual time that drives the real lease (Holder, Book,
// PlanTargets, IdentityPlan), allocation, admission (the agent's
// Pipeline) and edge (Round, the agent's rounds at the edge) code, and
// policy.Apply and edge.MemStore (the Lua scripts' pure twins) as its
// model of Redis,
// with a simulated network between the regions and the coordinator
// (delay, jitter, loss, partitions), coordinator crashes, Redis outages,
// clock drift and config changes.
//
// Every arrival is decided, in lockstep, by quota-lease and by three
// baselines: independent regional limits, a static split, and a single
// strongly consistent central counter that every request must reach across
// regions. An ideal global limiter (instant, never failing) decides too;
// it defines utilization and the valid requests a mode rejected while
// global capacity was free. Each mode's largest admitted total in any
// window is checked against what bound.Compute says it can be.
//
// The same scenario and seed give the same output, byte for byte.
package sim
