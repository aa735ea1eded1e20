package agent

import (
	"sync"

	"github.com/quota-lease/quota-lease/regional"
)

// fallback is the in-process bucket an agent instance decides with while
// Redis is slow or down: the same pure transition as the Lua scripts
// (regional.Apply), on this process's clock, per key. Its limits are the
// region's share divided by the live instances, so the region as a whole
// stays near its share; bound counts what it can add (a fresh full bucket
// per outage). Memory is bounded: when maxKeys identities are tracked, new
// ones are rejected rather than evicting others (an evicted key would come
// back full).
type fallback struct {
	maxKeys int

	mu    sync.Mutex
	state map[string]regional.State
}

func newFallback(maxKeys int) *fallback {
	return &fallback{maxKeys: maxKeys, state: map[string]regional.State{}}
}

// decide charges cost micro-units to key under l at nowMs. full reports a
// new key refused because the table is full.
func (f *fallback) decide(key string, l regional.Limits, nowMs, cost int64) (d regional.Decision, full bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.state[key]
	if !ok && len(f.state) >= f.maxKeys {
		return regional.Decision{RetryAfterMs: 1000}, true, nil
	}
	ns, d, err := regional.Apply(s, l, nowMs, cost)
	if err != nil {
		return regional.Decision{}, false, err
	}
	f.state[key] = ns
	return d, false, nil
}

// reset forgets every key: called when Redis is back, whose state is
// authoritative again.
func (f *fallback) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.state) > 0 {
		f.state = map[string]regional.State{}
	}
}
