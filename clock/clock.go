// Package clock is the time source the coordinator measures its deadlines
// on: wall time for what is stored, sent and shown, and a monotonic
// reading for every deadline, so that a wall-clock step (NTP, an operator,
// a VM resumed) never lengthens or shortens one. It links no I/O.
package clock

import "time"

// Clock reads time two ways.
type Clock interface {
	// Now is the wall-clock time, for records, logs and timestamps that
	// leave the process.
	Now() time.Time
	// Mono is a monotonic reading: the time elapsed since a fixed origin
	// of this Clock, unaffected by wall-clock steps. Deadlines are
	// measured on it.
	Mono() time.Duration
}

// System is the process's clock: time.Now, and Go's monotonic clock
// (time.Since of a reading taken when System was called).
func System() Clock { return system{origin: time.Now()} }

type system struct{ origin time.Time }

func (system) Now() time.Time        { return time.Now() }
func (s system) Mono() time.Duration { return time.Since(s.origin) }
