// Package regional enforces rate limits inside one region.
//
// A decision is one atomic Lua script run against the region's Redis: it
// reads the key's state, refills or rolls the window, caps at capacity,
// admits or rejects, persists and returns the decision, the remaining quota
// and the retry delay. Nothing is ever read and then written in two round
// trips.
//
// All state is fixed point: quota in integer micro-units (one request of cost
// 1 is 1,000,000 micro-units) and time in integer milliseconds taken from the
// Redis server clock (TIME), never from the caller. Every algorithm also
// exists as a pure Go function with the same arithmetic, so tests can run a
// table of cases through both and demand identical answers, and the
// simulator can drive the exact same transition on virtual time.
//
// The parameters of a bucket (capacity, rate, window) are inputs to the
// script rather than stored configuration, so a regional agent can enforce
// the share of a global quota its lease grants instead of the full limit.
package regional
