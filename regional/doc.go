// Package regional enforces rate limits inside one region, on its Redis.
//
// A decision is one atomic Lua script run against the region's Redis: it
// reads the key's state, refills or rolls the window, caps at capacity,
// admits or rejects, persists and returns the decision, the remaining quota
// and the retry delay. Nothing is ever read and then written in two round
// trips. The scripts are the Redis twins of package policy's pure
// transitions (policy.Apply): the same fixed-point arithmetic, proven
// identical by the differential tests. Time is the Redis server clock
// (TIME), never the caller's.
//
// A fixed window without an idempotency key is the exception, because the
// Lua interpreter costs Redis more than the decision: it is a charge of the
// window's counter (INCRBY, PEXPIRE NX) between two reads of the server
// clock, settled by the engine and taken back when rejected or made outside
// its window (window.go).
//
// The package owns the Engine, the scripts and the key layout (StateKey,
// the birth markers, Redis Cluster slots), and every other key a region's
// agents share in its Redis: Region saves the policies and grants, keeps
// the processes' presence and who holds each instance name, and syncs the
// edge reservations (EdgeStore, the twin of edge.MemStore). The parameters of a bucket
// (capacity, rate, window) are inputs to the script rather than stored
// configuration, so a regional agent can enforce the share of a global
// quota its lease grants instead of the full limit.
package regional
