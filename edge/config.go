package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
)

// Tuning are an agent's settings for its edge rounds: how often it
// plans, syncs its reservations with the region's store and pushes
// assignments, and the waits that keep the two phases safe. The agent's
// EdgeConfig (internal/agent) carries them with its wire settings; the
// simulator runs the defaults.
type Tuning struct {
	// Tick is how often, at most, the agent plans the identities that
	// need it (Key.Next, or changed inputs) and pushes assignments. It
	// writes a growing reservation to the region's store at once and
	// reads the store every ReadEvery. Default 100ms.
	Tick time.Duration
	// GrowWait is how long a larger reservation is held before an
	// assignment uses it, so that every agent of the region has read it
	// by then (each reads every ReadEvery, about half of it; one whose
	// last read is older than Trust leaves the edge's policies nothing
	// for direct checks). It must be the same on every agent of a
	// region, and well above Tick plus a Redis round trip. Default 500ms.
	GrowWait time.Duration
	// Margin is added to every assignment's time to live for its delivery
	// to Envoy (the stream, Envoy's main thread): the agent counts an
	// assignment that long after it sent it. Default 500ms.
	Margin time.Duration
	// ChangeEvery is the least time between changes of one bucket's
	// assignment on one stream: a changed token bucket may start full, and
	// its size pays for one start per ChangeEvery (a shorter interval
	// makes buckets smaller, tokens.Assign). Default 2s.
	ChangeEvery time.Duration
	// BurstFraction is the most of an instance's refill given up to pay
	// for buckets that start full (tokens.Assign, tokens.Resize). Default 0.2.
	BurstFraction float64
	// KeepsFill says the Envoy instances start a token bucket that
	// replaces an assigned one at the old one's fill ratio, as Envoy does
	// since PR #37624 (merged January 2025): a change then adds tokens only
	// as far as max_tokens grows, so a bucket may hold its share's whole
	// burst, and what a start or growth adds is taken from the room a
	// virtual bucket of the share leaves (tokens.Resize). False for older Envoy,
	// where every changed bucket may start full: buckets are then sized
	// for one start per ChangeEvery (tokens.Assign). Default true.
	KeepsFill bool
	// RepayOver is, with KeepsFill, the time over which a held bucket's
	// withheld refill rebuilds the room a start used (up to half the
	// burst); longer gives up less refill, and a bucket grows back more
	// slowly after its share shrank and grew again. Default 15s.
	RepayOver time.Duration
	// AbandonAfter is how long a bucket reports no requests before its
	// Envoy instance is told to drop it (AbandonAction). Default 1m.
	AbandonAfter time.Duration
}

// DefaultTuning returns the defaults above.
func DefaultTuning() Tuning {
	return Tuning{
		Tick:          100 * time.Millisecond,
		GrowWait:      500 * time.Millisecond,
		Margin:        500 * time.Millisecond,
		ChangeEvery:   2 * time.Second,
		BurstFraction: tokens.DefaultBurstFraction,
		KeepsFill:     true,
		RepayOver:     15 * time.Second,
		AbandonAfter:  time.Minute,
	}
}

// Config is what an agent's edge rounds run with: its tuning and the
// bound on every clock's rate error (the lease's drift).
type Config struct {
	Tuning
	Drift float64
}

// DefaultConfig is the default tuning with no drift bound (set Drift to
// the lease's).
func DefaultConfig() Config { return Config{Tuning: DefaultTuning()} }

// KeepFor is how long the region's store keeps an agent alive past a
// sync (Store), for assignments that live life: twice that plus a few
// rounds and a read, so that a dead agent's reservations end about two
// lives after its last sync, and a live agent, which syncs every
// ReadEvery, never waits for one to push.
func (c Config) KeepFor(life time.Duration) time.Duration { return 2*life + 4*c.Tick + c.ReadEvery() }

// EntryFor is how long the store keeps an entry past its write while its
// agent lives: ten times KeepFor, so that an entry whose reservation and
// demands hold is rewritten about once in that, not once per life (its
// agent's life ends it sooner, should the agent die).
func (c Config) EntryFor(life time.Duration) time.Duration { return 10 * c.KeepFor(life) }

// RefreshLead is how long before an assignment of ttl may expire it is
// sent again: a quarter of it, or a few rounds, and more than the longest
// wait for a round (ReadEvery: rounds do not wake for a refresh) and then
// for the message to reach Envoy (Margin) together. Later would risk a gap,
// and a refresh that may arrive after the bucket expired may start it
// anew, full: it is then sized as a start (Slot.refresh), down to DENY_ALL
// when the room for one is spent. Sooner keeps a share that is being moved
// away alive longer.
func (c Config) RefreshLead(ttl time.Duration) time.Duration {
	return max(ttl/4, 4*c.Tick, c.ReadEvery()+c.Margin+c.Tick)
}

// AlongLead is how long before an assignment of ttl may expire it is sent
// again along with another message to the same Envoy instance (Key.PushAlong):
// half of it, so that an instance's refreshes gather in one message.
func (c Config) AlongLead(ttl time.Duration) time.Duration { return max(ttl/2, c.RefreshLead(ttl)) }

// Trust is how long a read of the region's reservations may be relied
// on: less than GrowWait, however the clocks drift (a larger reservation
// is used only GrowWait after it was written).
func (c Config) Trust() time.Duration {
	return c.GrowWait - time.Duration(math.Ceil(3*c.Drift*float64(c.GrowWait))) - time.Millisecond
}

// surely is how long after the agent sends an assignment of time to live
// ttl Envoy surely still holds it, on the agent's clock: Envoy's clock may
// run fast against it by up to twice the drift bound (Lifetime is the
// latest end).
func surely(ttl time.Duration, drift float64) time.Duration {
	return ttl - time.Duration(math.Ceil(2*drift*float64(ttl)))
}

// ReadEvery is how often the agent must read the region's reservations
// when it has nothing to write (a growth is written at once): half of
// Trust, so that a read that takes a while still lands before the last
// one may no longer be relied on, and never more often than every Tick.
func (c Config) ReadEvery() time.Duration { return max(c.Tick, c.Trust()/2) }

// ReadDue reports whether a round at now must read the region's
// reservations, the last read having been sent at readAt.
func (c Config) ReadDue(readAt, now time.Time) bool { return now.Sub(readAt) >= c.ReadEvery() }
