package policy

// LocalBudget is a table of in-process limiters, one per key, for deciding
// without the shared store: the regional agent's local fallback while its
// Redis is slow or down, and the simulator's model of it. It is not safe
// for concurrent use.
//
// It is a budget of its own, never a copy of the store's state, and it is
// never reset: a key's limiter is created at its first decision holding
// only fraction start of its limits (Holding), and then follows Apply like
// any key in Redis. So however often the caller switches between the store
// and this table, each key is one limiter at the limits it is given, and
// over any window it admits at most what one such limiter admits: the
// fallback term of docs/bound.md, for any number of switches. A key is
// forgotten (Prune) only after it has been idle long enough to be full (or
// empty) anyway, which a key created anew never exceeds.
type LocalBudget[K comparable] struct {
	keys map[K]localEntry
}

type localEntry struct {
	s      State
	idleMs int64 // the limits' IdleAfter the last decision
}

// NewLocalBudget returns an empty table.
func NewLocalBudget[K comparable]() *LocalBudget[K] {
	return &LocalBudget[K]{keys: map[K]localEntry{}}
}

// Decide charges cost micro-units to key under l at nowMs; a key seen for
// the first time starts holding fraction start of l. Invalid input returns
// Apply's error and changes nothing.
func (b *LocalBudget[K]) Decide(key K, l Limits, start float64, nowMs, cost int64) (Decision, error) {
	e, ok := b.keys[key]
	if !ok {
		if err := l.Validate(); err != nil {
			return Decision{}, err
		}
		e.s = Holding(l, nowMs, start)
	}
	ns, d, err := Apply(e.s, l, nowMs, cost)
	if err != nil {
		return Decision{}, err
	}
	b.keys[key] = localEntry{s: ns, idleMs: l.IdleAfter(ns)}
	return d, nil
}

// Has reports whether key has a limiter.
func (b *LocalBudget[K]) Has(key K) bool { _, ok := b.keys[key]; return ok }

// Len is the number of keys with a limiter.
func (b *LocalBudget[K]) Len() int { return len(b.keys) }

// Prune forgets the keys idle at nowMs for longer than their limits'
// IdleMs, and returns how many it forgot.
func (b *LocalBudget[K]) Prune(nowMs int64) int {
	n := 0
	for k, e := range b.keys {
		if nowMs-e.s.LastMs > e.idleMs {
			delete(b.keys, k)
			n++
		}
	}
	return n
}
