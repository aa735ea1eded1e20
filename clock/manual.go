package clock

import (
	"sync/atomic"
	"time"
)

// Manual is a Clock that moves only when told, for tests and virtual
// time: both its wall and monotonic readings are the milliseconds last
// Set. The zero value reads the Unix epoch. It is safe for concurrent use.
type Manual struct{ ms atomic.Int64 }

// Set moves the clock to ms milliseconds (Unix time), backward too: a
// wall clock may step.
func (m *Manual) Set(ms int64) { m.ms.Store(ms) }

// Now is the time set.
func (m *Manual) Now() time.Time { return time.UnixMilli(m.ms.Load()) }

// Mono is the time set, as a duration since the epoch.
func (m *Manual) Mono() time.Duration { return time.Duration(m.ms.Load()) * time.Millisecond }
