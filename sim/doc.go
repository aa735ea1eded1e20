// Package sim is the region-shift simulator: deterministic, on virtual
// time, driving the real lease, allocation and regional code.
package sim
