package rlqs

import "github.com/quota-lease/quota-lease/edge"

// Load is what an engine serves at one moment: its streams, their buckets
// (the ALLOW_ALL ones included), and per policy identity its Envoy
// instances' buckets and how many of them hold an instance place.
type Load struct {
	Streams, Buckets int
	Identities       map[edge.ID]Slots
}

// Slots are one policy identity's buckets on an engine's streams.
type Slots struct{ Buckets, Placed int }

// Load is what e serves now.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := Load{Streams: len(e.streams), Buckets: e.buckets, Identities: map[edge.ID]Slots{}}
	for id, k := range e.r.Keys() {
		var s Slots
		for _, slot := range k.Slots {
			s.Buckets++
			if slot.Placed {
				s.Placed++
			}
		}
		l.Identities[id] = s
	}
	return l
}
