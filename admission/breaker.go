package admission

import (
	"sync"
	"time"
)

// breaker is a circuit breaker in front of the store, so that a dead or
// slow Redis does not add its timeout to every check: after threshold
// failures in a row it opens and checks go straight to the fallback; after
// cooldown one probe is let through (half-open), and its success closes it.
type breaker struct {
	threshold int
	cooldown  time.Duration
	now       func() time.Time

	mu       sync.Mutex
	failures int
	openedAt time.Time
	open     bool
	probing  bool
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, now: now}
}

// allow reports whether a call to Redis may be made now.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if !b.probing && b.now().Sub(b.openedAt) >= b.cooldown {
		b.probing = true // half-open: this caller probes
		return true
	}
	return false
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
