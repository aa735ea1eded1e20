package agent

import (
	"maps"
	"sort"
	"sync"
)

// topK tracks the heaviest identities of one policy with the space-saving
// algorithm: at most k counters, so memory stays bounded however many
// identities there are. A counter's count overestimates the identity's
// true count by at most its err.
//
// The counters live in one slice indexed by a map, so counting a new
// identity in a full table scans k counters in a slice and reuses the
// smallest one's slot: no allocation per check.
type topK struct {
	k  int
	mu sync.Mutex
	at map[string]int // identity -> its counter in c
	c  []counter
}

type counter struct {
	id         string
	count, err int64
}

func newTopK(k int) *topK { return &topK{k: k, at: make(map[string]int, k), c: make([]counter, 0, k)} }

// add counts n for id.
func (t *topK) add(id string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.at[id]; ok {
		t.c[i].count += n
		return
	}
	if len(t.c) < t.k {
		t.at[id] = len(t.c)
		t.c = append(t.c, counter{id: id, count: n})
		return
	}
	// Replace the smallest counter; the newcomer inherits its count as
	// possible error.
	m := 0
	for i, c := range t.c {
		if c.count < t.c[m].count || (c.count == t.c[m].count && c.id < t.c[m].id) {
			m = i
		}
	}
	min := t.c[m]
	delete(t.at, min.id)
	t.at[id] = m
	t.c[m] = counter{id: id, count: min.count + n, err: min.count}
}

// entry is one identity's estimated count.
type entry struct {
	ID    string
	Count int64
}

// decay halves every count and drops those that reach zero, so the list
// follows what is hot now rather than since the start.
func (t *topK) decay() {
	t.mu.Lock()
	defer t.mu.Unlock()
	kept := t.c[:0]
	for _, c := range t.c {
		c.count /= 2
		c.err /= 2
		if c.count == 0 {
			delete(t.at, c.id)
			continue
		}
		t.at[c.id] = len(kept)
		kept = append(kept, c)
	}
	clear(t.c[len(kept):]) // drop the identities' strings
	t.c = kept
}

// top returns the tracked identities, heaviest first.
func (t *topK) top() []entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]entry, 0, len(t.c))
	for _, c := range t.c {
		out = append(out, entry{c.id, c.count})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// hotIdentities is the top-K heaviest identities of every policy, as the
// hot-identity metric shows them (hotCollector).
type hotIdentities struct {
	k  int
	mu sync.Mutex
	by map[string]*topK // by policy
}

func newHotIdentities(k int) *hotIdentities { return &hotIdentities{k: k, by: map[string]*topK{}} }

// of is policy's top-K, made on first use.
func (h *hotIdentities) of(policy string) *topK {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.by[policy]
	if t == nil {
		t = newTopK(h.k)
		h.by[policy] = t
	}
	return t
}

// decay halves every policy's top-K counts.
func (h *hotIdentities) decay() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range h.by {
		t.decay()
	}
}

// policies is a copy of the top-K by policy.
func (h *hotIdentities) policies() map[string]*topK {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.by)
}
