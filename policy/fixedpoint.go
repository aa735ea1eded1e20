package policy

// Micro is the number of micro-units in one unit of quota: a request of
// cost 1 consumes Micro micro-units. Quota state is kept in micro-units so
// that fractional shares of a limit (a third of 100 req/min) need no floats.
const Micro int64 = 1_000_000

// Units converts micro-units to units, for showing a quantity to a person
// or a script (the CLI's -o json, the console).
func Units(micro int64) float64 { return float64(micro) / float64(Micro) }

// Bounds that keep every intermediate value of the Lua arithmetic below
// 2^53, where Redis's Lua (doubles) is still exact. Limits.Validate enforces
// them, so the Go and Lua transitions always agree.
const (
	// MaxCapacity is the largest bucket or window limit in micro-units
	// (10^9 requests).
	MaxCapacity int64 = 1_000_000_000 * Micro
	// MaxRate is the largest refill rate in micro-units per second
	// (10^6 requests per second).
	MaxRate int64 = 1_000_000 * Micro
	// MaxFillMs is the longest time an empty bucket may take to refill
	// (about ten years); slower buckets are a configuration mistake.
	MaxFillMs int64 = 10 * 365 * 24 * 3600 * 1000
	// MaxWindowMs is the longest window of the windowed algorithms (24h).
	MaxWindowMs int64 = 24 * 3600 * 1000
)

// Products such as a limit in micro-units times a window in milliseconds
// overflow an int64; every a·m/d of this package is scale.Down or
// scale.Up, exact for non-negative inputs whose result fits. The Lua
// scripts compute the same values by splitting a on d, which is exact
// under the bounds above.
