package policy

import "math/bits"

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

// mulDiv returns a*m/d rounded down, or up when up is true. It is exact for
// any non-negative int64 inputs with d > 0 whose result fits in an int64.
// The Lua scripts compute the same value by splitting a on d, which is
// exact under the bounds above.
func mulDiv(a, m, d int64, up bool) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(m))
	q, r := bits.Div64(hi, lo, uint64(d))
	if up && r != 0 {
		q++
	}
	return int64(q)
}

// ceilDiv returns a/d rounded up for a >= 0, d > 0.
func ceilDiv(a, d int64) int64 {
	return mulDiv(a, 1, d, true)
}
