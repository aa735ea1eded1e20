package admission

import (
	"sync"
	"time"
)

// replay remembers the decisions this agent made for idempotency keys, so
// that a keyed retry gets the first attempt's answer uncharged whichever
// path decided it: Redis keeps its own record of keys it decided, but a
// retry that meets the local fallback (Redis slow or down), or that
// reaches Redis after the fallback decided the first attempt, would be
// charged again without this one. It covers this process only: a retry
// sent to another replica during a Redis outage is charged there.
//
// Entries live for window (the engine's idempotency window) on the
// monotonic clock; with max entries held, the oldest go first.
type replay struct {
	window time.Duration
	max    int

	mu    sync.Mutex
	m     map[string]replayed
	order []queued // every put, oldest first: expiries never decrease
}

type replayed struct {
	o   Outcome
	exp time.Time
}

// queued is one put: key and the expiry it was put with, so an entry put
// again after expiring is told apart from the one in the map.
type queued struct {
	key string
	exp time.Time
}

func newReplay(window time.Duration, max int) *replay {
	return &replay{window: window, max: max, m: map[string]replayed{}}
}

// get returns the outcome recorded for key, if it is still within the
// window at now.
func (r *replay) get(key string, now time.Time) (Outcome, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[key]
	if !ok || !now.Before(e.exp) {
		return Outcome{}, false
	}
	return e.o, true
}

// put records o for key at now, unless key already has an outcome (the
// first decision is the one replayed). It drops expired entries, and the
// oldest ones while more than max are held.
func (r *replay) put(key string, o Outcome, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.m[key]; ok && now.Before(e.exp) {
		return
	}
	exp := now.Add(r.window)
	r.m[key] = replayed{o: o, exp: exp}
	r.order = append(r.order, queued{key, exp})
	for len(r.order) > 0 && (len(r.m) > r.max || !now.Before(r.order[0].exp)) {
		q := r.order[0]
		r.order = r.order[1:]
		if e, ok := r.m[q.key]; ok && e.exp.Equal(q.exp) { // not put again since
			delete(r.m, q.key)
		}
	}
}
