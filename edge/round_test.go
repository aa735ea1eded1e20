package edge

import (
	"cmp"
	"context"
	"iter"
	"sync"
	"testing"
	"time"

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
	sent       []sent
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
func (w *roundWorld) ValidUntil(string) time.Time { return w.now.Add(time.Hour) }
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
// 5 s since the last), and rounds as the agent's timer
// runs them (Result.After, rounded down to whole ms).
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
		var last Bucket
		for _, s := range w.sent {
			if s.at.Sub(w.sent[0].at) < 10*time.Second {
				continue // settling
			}
			if s.Abandon || s.Bucket.Deny() || (last != Bucket{} && s.Bucket.MaxTokens < last.MaxTokens) {
				t.Fatalf("ttl %ds: at +%s slot %d was sent %+v after %+v: a steady bucket shrank", ttl, s.at.Sub(w.sent[0].at), s.Slot, s.Send, last)
			}
			last = s.Bucket
		}
		if last == (Bucket{}) {
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
	last := map[int]Bucket{}
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
