package admission

import (
	"sync"
	"time"
)

// breaker is a circuit breaker in front of the store, so that a dead or
// slow Redis does not add its timeout to every check: after threshold
// failures in a row it opens and checks go straight to the fallback; after
// cooldown one probe is let through (half-open), and its success closes it.
// The probe is a check, or a caller's own probe of the store (probe), so
// that the breaker also closes while no check arrives.
type breaker struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time
	// opened is signalled when the breaker opens, for a prober to wait on
	// rather than poll.
	opened chan struct{}

	mu       sync.Mutex
	failures int
	openedAt time.Time
	open     bool
	probing  bool
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, now: now, opened: make(chan struct{}, 1)}
}

// allow reports whether a call to Redis may be made now.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open || b.halfOpenLocked()
}

// probe reports whether the caller may probe the store now, outside a
// check: the breaker is open, its cooldown has passed and no other probe
// is in flight. The caller then reports with result (or release).
func (b *breaker) probe() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open && b.halfOpenLocked()
}

// halfOpenLocked lets one probe through an open breaker once its cooldown
// has passed since it opened (or since the last probe failed).
func (b *breaker) halfOpenLocked() bool {
	if b.probing || b.now().Sub(b.openedAt) < b.cooldown {
		return false
	}
	b.probing = true // half-open: this caller probes
	return true
}

// result records the outcome of an allowed call.
func (b *breaker) result(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.failures, b.open, b.probing = 0, false, false
		return
	}
	b.failures++
	if b.probing || b.failures >= b.threshold {
		if !b.open {
			select {
			case b.opened <- struct{}{}:
			default:
			}
		}
		b.open, b.probing, b.openedAt = true, false, b.now()
	}
}

// release ends an allowed call that proved nothing either way (the store
// refused it before trying): a probe may be let through again.
func (b *breaker) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// isOpen reports whether checks currently bypass the store.
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
