package edge

import (
	"cmp"
	"context"
	"errors"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// roundWorld is what a test's rounds run against: one policy, the
// capacity every identity gets, a store in memory, and a record of what
// the rounds send, on a manual clock.
type roundWorld struct {
	p          *policy.Policy
	capacity   func(since time.Duration) int64 // by the time since the start
	start, now time.Time
	step       time.Duration // the longest between two looks at the capacity
	renewEvery time.Duration // 0: the grant always has an hour left; else a 10 s grant renewed this often
	sent       []sent
	// each, when set, runs at every step of run before its rounds (direct
	// checks, a look at the keys).
	each func(at time.Duration)
}

type sent struct {
	at time.Time
	id ID
	Send[int]
}

func (w *roundWorld) Policy(name string) *policy.Policy {
	if name == w.p.Name {
		return w.p
	}
	return nil
}
func (w *roundWorld) ValidUntil(string) time.Time {
	if w.renewEvery == 0 {
		return w.now.Add(time.Hour)
	}
	return w.start.Add(w.now.Sub(w.start).Truncate(w.renewEvery) + 10*time.Second)
}
func (w *roundWorld) EnforceAt(string, string, time.Time) int64 {
	return w.capacity(w.now.Sub(w.start))
}
func (w *roundWorld) Heir() string              { return "" }
func (w *roundWorld) Queue(id ID, a Send[int])  { w.sent = append(w.sent, sent{w.now, id, a}) }
func (w *roundWorld) Refused(ID, int)           {}
func (w *roundWorld) Along() iter.Seq2[ID, int] { return func(func(ID, int) bool) {} }
func (w *roundWorld) clock() time.Time          { return w.now }
func newRoundWorld(p *policy.Policy, capacity func(time.Duration) int64) *roundWorld {
	return &roundWorld{p: p, capacity: capacity, start: time.UnixMilli(1e12), now: time.UnixMilli(1e12), step: 100 * time.Millisecond}
}
func (w *roundWorld) rounds(cfg Config) *Round[int] {
	return NewRound(cfg, cmp.Compare[int], w, NewMemStore(w.ms).Agent("a", ""), w)
}
func (w *roundWorld) ms() int64 { return w.now.UnixMilli() }

// run drives r until end: every 5 s the reports (slot: requests over the
// 5 s since the last), at every step w.each, and rounds as the agent's
// timer runs them (Result.After, rounded down to whole ms).
func (w *roundWorld) run(r *Round[int], id ID, end time.Duration, report func(at time.Duration) map[int]uint64) {
	start := w.start
	var mu sync.Mutex
	roundAt := r.cfg.Tick
	for at := time.Duration(0); at < end; {
		w.now = start.Add(at)
		if at%(5*time.Second) == 0 {
			k := r.Key(id, w.p)
			for slot, n := range report(at) {
				s := k.Slots[slot]
				if s == nil {
					s = k.Add(slot, w.now)
					roundAt = at
				}
				s.Report(w.p, n, 5*time.Second, w.now)
				k.Touch()
			}
		}
		if w.each != nil {
			w.each(at)
		}
		for roundAt == at {
			roundAt = at + r.Run(context.Background(), &mu, w.clock).After(r.cfg, w.now).Truncate(time.Millisecond)
		}
		at = min(roundAt, (at/(5*time.Second)+1)*5*time.Second, at+w.step)
	}
}

// An instance whose demand and share hold steady keeps its bucket: every
// refresh reaches it while it surely holds the last (a refresh that may
// come after the bucket expired would be a start, sized by what room is
// left for one: down to DENY_ALL), with rounds as far apart as they come
// (every ReadEvery) and assignments of 1 and 2 s.
func TestSteadyBucketKeptThroughRefreshes(t *testing.T) {
	for _, ttl := range []int{1, 2, 4} {
		p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
		p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny, TTL: policy.Duration(time.Duration(ttl) * time.Second)}
		w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
		r := w.rounds(Config{Tuning: DefaultTuning(), Drift: 1e-4})
		r.SetPolicies([]*policy.Policy{p})
		w.run(r, ID{p.Name, "tenant=a"}, 40*time.Second, func(time.Duration) map[int]uint64 { return map[int]uint64{1: 300, 2: 300} })
		var last tokens.Bucket
		for _, s := range w.sent {
			if s.at.Sub(w.sent[0].at) < 10*time.Second {
				continue // settling
			}
			if s.Abandon || s.Bucket.Deny() || (last != tokens.Bucket{} && s.Bucket.MaxTokens < last.MaxTokens) {
				t.Fatalf("ttl %ds: at +%s slot %d was sent %+v after %+v: a steady bucket shrank", ttl, s.at.Sub(w.sent[0].at), s.Slot, s.Send, last)
			}
			last = s.Bucket
		}
		if last == (tokens.Bucket{}) {
			t.Fatalf("ttl %ds: nothing sent after settling", ttl)
		}
	}
}

// A share that shrinks a little while its last change is younger than
// ChangeEvery keeps its bucket: the shrink goes with the refresh that is
// due, where letting the bucket expire would make the change a start.
// The capacity falls by a twentieth 300 ms after a report changed the
// shares.
func TestShrinkWaitingForItsChangeKeepsTheBucket(t *testing.T) {
	p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
	p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny, TTL: policy.Duration(2 * time.Second)}
	full := p.Limits().Amount()
	w := newRoundWorld(p, func(since time.Duration) int64 {
		if since >= 20300*time.Millisecond {
			return full - full/20
		}
		return full
	})
	r := w.rounds(Config{Tuning: DefaultTuning(), Drift: 1e-4})
	r.SetPolicies([]*policy.Policy{p})
	w.run(r, ID{p.Name, "tenant=a"}, 30*time.Second, func(at time.Duration) map[int]uint64 {
		if at >= 20*time.Second {
			return map[int]uint64{1: 150, 2: 200} // the shares change at 20 s
		}
		return map[int]uint64{1: 175, 2: 175}
	})
	last := map[int]tokens.Bucket{}
	shrunk := false
	for _, s := range w.sent {
		since := s.at.Sub(w.start)
		if prev, ok := last[s.Slot]; ok && since >= 15*time.Second {
			if s.Bucket.Deny() || s.Bucket.MaxTokens < prev.MaxTokens*3/4 {
				t.Fatalf("at %s slot %d was sent %+v after %+v", since, s.Slot, s.Send, prev)
			}
			shrunk = shrunk || since > 20300*time.Millisecond && since < 22*time.Second && s.Bucket.Rate() < prev.Rate()
		}
		last[s.Slot] = s.Bucket
	}
	if !shrunk {
		t.Fatal("no bucket shrank with the capacity before the change interval ended")
	}
}

// An agent paused longer than its life in the store (its entries ended
// there, and another agent grew into the capacity) grows again from none
// when it syncs again, and waits as any growth does: once it runs again,
// the two agents' visible reservations, what each pushes assignments
// within, never add up to more than the capacity (while it was paused, it
// pushed nothing, and what it had pushed expired).
func TestPausedAgentGrowsAgain(t *testing.T) {
	p := edgePolicy(t)
	capacity := p.Limits().Amount()
	var now time.Time
	store := NewMemStore(func() int64 { return now.UnixMilli() })
	cfg := Config{Tuning: DefaultTuning(), Drift: 1e-4}
	type agent struct {
		w    *roundWorld
		r    *Round[int]
		next time.Duration
	}
	newAgent := func(name string) *agent {
		w := newRoundWorld(p, func(time.Duration) int64 { return capacity })
		r := NewRound(cfg, cmp.Compare[int], w, store.Agent(name, ""), w)
		r.SetPolicies([]*policy.Policy{p})
		return &agent{w: w, r: r}
	}
	a, b := newAgent("a"), newAgent("b")
	id := ID{p.Name, "tenant=a"}
	var mu sync.Mutex
	// step runs ag at at: its instance's report every 5 s (demand at
	// twice the limit), and its rounds as its timer runs them.
	step := func(ag *agent, at time.Duration) {
		now = ag.w.start.Add(at)
		ag.w.now = now
		if at%(5*time.Second) == 0 {
			k := ag.r.Key(id, p)
			s := k.Slots[1]
			if s == nil {
				s, ag.next = k.Add(1, now), at
			}
			s.Report(p, uint64(2*p.Limit*5), 5*time.Second, now)
			k.Touch()
		}
		for ag.next <= at {
			ag.next = at + ag.r.Run(context.Background(), &mu, ag.w.clock).After(cfg, now).Truncate(time.Millisecond)
		}
	}
	visible := func(ag *agent) int64 {
		if k := ag.r.Lookup(id); k != nil {
			return k.Visible
		}
		return 0
	}
	for at := time.Duration(0); at < 45*time.Second; at += 10 * time.Millisecond {
		if at < 10*time.Second || at >= 30*time.Second { // a is paused in between
			step(a, at)
		}
		if at >= 10*time.Second {
			step(b, at)
		}
		if va, vb := visible(a), visible(b); at >= 30*time.Second && va+vb > capacity {
			t.Fatalf("at %s a may enforce %d and b %d, more than the capacity %d", at, va, vb, capacity)
		}
		if at == 29*time.Second && visible(b) < capacity*9/10 {
			t.Fatalf("b may enforce %d of %d once a's life ended", visible(b), capacity)
		}
	}
	if visible(a) == 0 || visible(b) == 0 {
		t.Fatalf("the two do not share the capacity 15 s after a came back: a %d, b %d of %d", visible(a), visible(b), capacity)
	}
}

// An agent paused longer than its life in the store finds, at its next
// sync, that the store holds nothing of what it reserved: whatever it held
// visible is gone, and what the store grants it anew waits GrowWait, as
// any growth does (the other agents' direct checks have not read it yet).
// The same holds when every sync before the pause failed after reaching
// the store (a read that timed out, say): those syncs kept the agent alive
// in a life all the same.
func TestPausedAgentWaitsForItsGrowth(t *testing.T) {
	for _, failing := range []bool{false, true} {
		p := edgePolicy(t)
		w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
		w.renewEvery = 3 * time.Second
		cfg := Config{Tuning: DefaultTuning(), Drift: 1e-4}
		st := &failingStore{Store: NewMemStore(w.ms).Agent("a", ""), fail: failing}
		r := NewRound(cfg, cmp.Compare[int], w, st, w)
		r.SetPolicies([]*policy.Policy{p})
		id := ID{p.Name, "tenant=a"}
		demand := func(time.Duration) map[int]uint64 { return map[int]uint64{1: uint64(2 * p.Limit * 5)} }
		w.run(r, id, 10*time.Second, demand)
		k := r.Lookup(id)
		if k.Visible == 0 {
			t.Fatalf("failing %v: nothing visible before the pause", failing)
		}
		w.start = w.start.Add(30 * time.Second) // paused for 20 s, past its life
		st.fail = false
		var mu sync.Mutex
		w.now = w.start
		r.Run(context.Background(), &mu, w.clock)
		if k.Visible != 0 {
			t.Fatalf("failing %v: %d visible right after the pause, want none until a growth waited", failing, k.Visible)
		}
		w.run(r, id, 2*time.Second, demand)
		if k.Visible == 0 {
			t.Fatalf("failing %v: nothing visible 2 s after the pause", failing)
		}
	}
}

// failingStore is a store whose syncs, while fail, reach it and then fail
// (the read timed out): the writes land, the read is lost.
type failingStore struct {
	Store
	fail bool
}

func (s *failingStore) Sync(ctx context.Context, writes []Write, read bool, alive time.Duration) (SyncAnswer, error) {
	ans, err := s.Store.Sync(ctx, writes, read, alive)
	if s.fail && err == nil {
		ans.Others, err = nil, errors.New("the read timed out")
	}
	return ans, err
}
