package edge

import (
	"context"
	"iter"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// What a Round asks of the agent around it: its leases, the region's
// store of reservations, and the Envoy instances' streams. The agent
// implements them over its leaser, its region's Redis and RLQS; the
// simulator over its model of each.

// Leases is what rounds ask of the agent's leases.
type Leases interface {
	// Policy is policy name if the edge serves it (edge settings, global
	// scope); nil otherwise.
	Policy(name string) *policy.Policy
	// ValidUntil is when the agent's grant of policy name stops holding,
	// on its clock (zero without one).
	ValidUntil(name string) time.Time
	// EnforceAt is the region's capacity for identity of policy name at t
	// (no capacity grows while nothing is renewed).
	EnforceAt(name, identity string, t time.Time) int64
	// Heir names the agent process this one succeeded under its name, if
	// any: the store moves that process's entries to this one.
	Heir() string
}

// Store is the region's store of edge reservations (regional.EdgeStore on
// the region's Redis, MemStore in memory).
type Store interface {
	// Sync applies writes, in order, and returns what it granted each;
	// when read, it also returns what the other agents hold, per key. It
	// keeps the agent alive for alive more: the entries it writes end
	// with that life (or their own Life, if sooner), so that an agent
	// whose entries do not change need not rewrite them, and a dead
	// agent's end soon after its last sync. An agent that syncs after its
	// life ended starts another, and what it held in the last is over.
	// On an error, Granted answers the writes that landed, the first ones,
	// and Life the life the store found the agent in, if it reached the
	// store at all: it kept the agent alive all the same.
	Sync(ctx context.Context, writes []Write, read bool, alive time.Duration) (SyncAnswer, error)
}

// SyncAnswer is what a sync found: what the store granted each write, what
// the other agents hold per key (nil when it read nothing), and the life
// the agent synced in (Store.Sync; 0 when it was not kept alive, or the
// sync never reached the store).
type SyncAnswer struct {
	Granted []Granted
	Others  map[ID]Others
	Life    int64
}

// Write is an update of one key's reservation.
type Write struct {
	ID ID
	Update
}

// Sender delivers a round's actions to the Envoy instances.
type Sender[S comparable] interface {
	// Queue queues a for its slot's instance. An abandon's slot is
	// forgotten by the round as it is queued.
	Queue(id ID, a Send[S])
	// Refused notes that slot s of id was refused an instance place: the
	// policy's instances per region are all taken.
	Refused(id ID, s S)
	// Along lists the slots of every instance queued something this round
	// (their other buckets' refreshes ride along).
	Along() iter.Seq2[ID, S]
}
