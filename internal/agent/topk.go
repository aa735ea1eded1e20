package agent

import (
	"sort"
	"sync"
)

// topK tracks the heaviest identities of one policy with the space-saving
// algorithm: at most k counters, so memory stays bounded however many
// identities there are. A counter's count overestimates the identity's
// true count by at most its err.
type topK struct {
	k  int
	mu sync.Mutex
	c  map[string]*counter
}

type counter struct {
	count, err int64
}

func newTopK(k int) *topK { return &topK{k: k, c: make(map[string]*counter, k)} }

// add counts n for id.
func (t *topK) add(id string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.c[id]; c != nil {
		c.count += n
		return
	}
	if len(t.c) < t.k {
		t.c[id] = &counter{count: n}
		return
	}
	// Replace the smallest counter; the newcomer inherits its count as
	// possible error.
	var minID string
	var min *counter
	for k, c := range t.c {
		if min == nil || c.count < min.count || (c.count == min.count && k < minID) {
			minID, min = k, c
		}
	}
	delete(t.c, minID)
	t.c[id] = &counter{count: min.count + n, err: min.count}
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
	for id, c := range t.c {
		c.count /= 2
		c.err /= 2
		if c.count == 0 {
			delete(t.c, id)
		}
	}
}

// top returns the tracked identities, heaviest first.
func (t *topK) top() []entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]entry, 0, len(t.c))
	for id, c := range t.c {
		out = append(out, entry{id, c.count})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].ID < out[j].ID
	})
	return out
}
