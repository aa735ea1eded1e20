package admission

import (
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// overLimit remembers identities Redis rejected, until their retry delay
// has passed, so that an abusive hot key is rejected in-process, with the
// same answer and a correct remaining delay, and costs no Redis call.
//
// It is exact, not an approximation: a rejected identity can only become
// admissible by refill, which nothing speeds up (other regions and other
// instances of this one only consume), so Redis would reject it too until
// the delay it gave has passed. The delay is counted from before the
// request was sent, never from its answer, so the cache never rejects
// longer than Redis would. An entry holds only for the limits it was
// decided under: a changed policy or a changed share (a new grant, a
// degraded budget) misses and goes to Redis, which also drops the entry.
// A request of smaller cost, which might fit sooner, goes to Redis too.
// A policy that accepts returns is never cached (Ticket.cachesRejections):
// there a return, through any instance, frees capacity at any moment.
//
// At most max identities are held; when full, expired entries are swept,
// and if none are, new rejections are not remembered (the cache only ever
// saves work).
type overLimit struct {
	max int

	mu sync.Mutex
	m  map[string]overEntry
}

type overEntry struct {
	limits      policy.Limits
	cost        int64 // micro-units of the rejected request
	sent, until time.Time
	d           policy.Decision
}

func newOverLimit(max int) *overLimit {
	return &overLimit{max: max, m: map[string]overEntry{}}
}

// get returns the rejection remembered for key under limits, for a request
// of cost micro-units at now, with its delays shortened by the time passed.
func (c *overLimit) get(key string, limits policy.Limits, cost int64, now time.Time) (policy.Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return policy.Decision{}, false
	}
	if e.limits != limits || !now.Before(e.until) {
		delete(c.m, key)
		return policy.Decision{}, false
	}
	if cost < e.cost {
		return policy.Decision{}, false
	}
	d := e.d
	d.RetryAfterMs = max(1, int64((e.until.Sub(now)+time.Millisecond-1)/time.Millisecond)) // rounded up
	d.ResetAfterMs = max(0, d.ResetAfterMs-now.Sub(e.sent).Milliseconds())                 // rounded down: never early
	return d, true
}

// put remembers d, a rejection Redis gave key under limits for a request
// of cost micro-units sent at sent.
func (c *overLimit) put(key string, limits policy.Limits, cost int64, d policy.Decision, sent time.Time) {
	if d.Allowed || d.Replayed || d.RetryAfterMs <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		for k, e := range c.m {
			if !sent.Before(e.until) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= c.max {
			return
		}
	}
	c.m[key] = overEntry{
		limits: limits,
		cost:   cost,
		d:      d,
		sent:   sent,
		until:  sent.Add(time.Duration(d.RetryAfterMs) * time.Millisecond),
	}
}
