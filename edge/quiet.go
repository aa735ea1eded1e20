package edge

import "time"

// An agent with nothing at the edge (no Envoy instance reports, no other
// agent holds a reservation) and no direct check of a policy the edge
// serves since its last read has nothing to read the region's
// reservations for: its rounds go quiet, one every QuietEvery, and read
// nothing. A direct check that finds the last read too old to rely on
// asks for one (WantRead) and waits for it; while checks keep coming, the
// rounds read every ReadEvery again. A view older than Trust is never
// relied on, so how seldom an agent reads never lets a check miss a
// reservation: it only makes the check wait for a read.

// QuietEvery is how far apart quiet rounds come. They have nothing to do
// that cannot wait: a new bucket and a direct check that wants a read
// each kick the rounds, and an idle agent's wakeups cost more than their
// work.
const QuietEvery = 10 * time.Second

// Quiet reports whether the last round was quiet: a direct check that
// finds the last read too old may ask for one and wait for it (WantRead).
// Rounds that read and fail (Redis unreachable) are not quiet: a check
// then has nothing to wait for. Safe for concurrent use.
func (r *Round[S]) Quiet() bool { return r.quietNow.Load() }

// WantRead asks the next round to read the region's reservations, quiet
// or not. Safe for concurrent use.
func (r *Round[S]) WantRead() { r.readWanted.Store(true) }

// quiet reports whether the rounds have nothing to read the region's
// reservations for: no key, no identity only other agents serve, no other
// agent's holding in the last read; no direct check since the last
// measure nor a rate of them still measured (their rates decay to nothing
// within seconds of the last check); and the last read did not fail.
func (r *Round[S]) quiet() bool {
	if len(r.keys) > 0 || len(r.directOnly) > 0 || len(r.regionKeys) > 0 {
		return false
	}
	if len(r.directRate) > 0 || r.readFailed {
		return false
	}
	r.directMu.Lock()
	defer r.directMu.Unlock()
	return len(r.direct) == 0
}

// Rest marks the rounds quiet without running one, for an agent that
// serves no policy at the edge and so skips its rounds: a direct check of
// a policy served since then that finds no recent read asks for one
// (WantRead), as after a quiet round, instead of taking the edge to hold
// everything until the next round. Safe for concurrent use.
func (r *Round[S]) Rest() { r.quietNow.Store(true) }
