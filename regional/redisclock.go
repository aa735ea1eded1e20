package regional

import (
	"sync/atomic"
	"time"
)

// redisClock is an engine's view of its Redis server's clock, for the
// fixed windows it decides without the script (window.go): which window a
// decision belongs to must be known before its counter's key is sent.
//
// The estimate is only a guess. Every pipeline that charges a counter
// reads TIME before and after its commands, and a decision whose two
// readings are not both in the window it was sent for is refunded and
// decided again by the script, on the server's clock. So the estimate's
// error costs round trips, never admissions: it is refreshed from those
// same replies, on every such pipeline.
//
// The floor is the latest time the engine decided a fixed window at: no
// fixed-window decision of the engine is made earlier, so a server clock
// stepped back makes no window count twice for this engine (the scripts
// of the other algorithms clamp the same way, per key).
type redisClock struct {
	base time.Time // a monotonic reading: the origin of the local side
	// offsetUs is the server clock minus the time since base, in µs, as
	// the last TIME reply measured it; noOffset before the first.
	offsetUs atomic.Int64
	floorMs  atomic.Int64
}

// noOffset marks a clock that has read no TIME reply yet.
const noOffset = -1 << 62

func newRedisClock() *redisClock {
	c := &redisClock{base: time.Now()}
	c.offsetUs.Store(noOffset)
	return c
}

// estimate returns the server clock in ms as the last TIME reply predicts
// it now. Before any reply it takes the local wall clock: the first
// pipeline corrects it.
func (c *redisClock) estimate() int64 {
	off := c.offsetUs.Load()
	if off == noOffset {
		return time.Now().UnixMilli()
	}
	return (time.Since(c.base).Microseconds() + off) / 1000
}

// observe records a TIME reply read by a pipeline sent at sent and
// answered at recv (both monotonic readings): the server read its clock
// somewhere in between, taken as the middle.
func (c *redisClock) observe(server time.Time, sent, recv time.Time) {
	mid := sent.Sub(c.base).Microseconds() + recv.Sub(sent).Microseconds()/2
	c.offsetUs.Store(server.UnixMicro() - mid)
}

// floor returns the latest fixed-window decision time, in ms.
func (c *redisClock) floor() int64 { return c.floorMs.Load() }

// raise makes ms the floor if it is later.
func (c *redisClock) raise(ms int64) {
	for {
		f := c.floorMs.Load()
		if ms <= f || c.floorMs.CompareAndSwap(f, ms) {
			return
		}
	}
}
