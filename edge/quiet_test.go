package edge

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// readCounter counts the syncs that read the region's reservations.
type readCounter struct {
	Store
	reads int
}

func (c *readCounter) Sync(ctx context.Context, writes []Write, read bool, alive time.Duration) (SyncAnswer, error) {
	if read {
		c.reads++
	}
	return c.Store.Sync(ctx, writes, read, alive)
}

// Rounds with nothing at the edge and no direct check read nothing, and
// come a QuietEvery apart; a read asked for (WantRead) comes with the next
// round; direct checks make the rounds read every ReadEvery while they
// come, and quiet again once their rate decayed after they stopped.
func TestQuietRoundsReadWhenAsked(t *testing.T) {
	p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
	p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny}
	w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
	cfg := Config{Tuning: DefaultTuning(), Drift: 1e-4}
	st := &readCounter{Store: NewMemStore(w.ms).Agent("a", "")}
	r := NewRound(cfg, func(a, b int) int { return a - b }, w, st, w)
	r.SetPolicies([]*policy.Policy{p})
	var mu sync.Mutex
	// rounds runs rounds as the agent's timer does for d, calling each
	// before every one, and returns how many ran.
	rounds := func(d time.Duration, each func()) int {
		n := 0
		for end := w.now.Add(d); w.now.Before(end); n++ {
			each()
			w.now = w.now.Add(r.Run(context.Background(), &mu, w.clock).After(cfg, w.now))
		}
		return n
	}
	if n := rounds(30*time.Second, func() {}); st.reads > 0 || n > 4 {
		t.Fatalf("30 s with nothing at the edge: %d rounds, %d reads; want one every %v, none", n, st.reads, QuietEvery)
	}
	r.WantRead()
	r.Run(context.Background(), &mu, w.clock)
	if st.reads != 1 || !r.View().Fresh(w.now, cfg.Trust()) {
		t.Fatalf("a read asked for: %d reads, view fresh %v; want one, fresh", st.reads, r.View().Fresh(w.now, cfg.Trust()))
	}
	check := func() { r.ObserveDirect(p.Name, "tenant=a", p.Cost*policy.Micro) }
	before := st.reads
	rounds(3*time.Second, check)
	if n, want := st.reads-before, int(3*time.Second/cfg.ReadEvery()); n < want-1 || !r.View().Fresh(w.now, cfg.Trust()) {
		t.Fatalf("3 s of direct checks at every round: %d reads, want about %d, the view kept fresh", n, want)
	}
	rounds(30*time.Second, func() {}) // their rate decays to nothing
	before = st.reads
	if rounds(5*time.Second, func() {}); st.reads != before {
		t.Fatalf("the checks stopped: %d more reads after 30 s, want none", st.reads-before)
	}
}

// A read that fails (Redis unreachable) leaves the rounds not quiet, so
// that direct checks do not wait for reads that fail (Quiet) while the
// rounds keep trying every ReadEvery; once one answers with nothing to
// read for, they are quiet again.
func TestFailedReadIsNotQuiet(t *testing.T) {
	p := testPolicy(t, policy.TokenBucket, 100, 100, time.Second, 1)
	p.Edge = &policy.Edge{Instances: 4, NoAssignment: policy.EdgeDeny}
	w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
	cfg := Config{Tuning: DefaultTuning(), Drift: 1e-4}
	st := &failingStore{Store: NewMemStore(w.ms).Agent("a", ""), fail: true}
	r := NewRound(cfg, func(a, b int) int { return a - b }, w, st, w)
	r.SetPolicies([]*policy.Policy{p})
	var mu sync.Mutex
	if res := r.Run(context.Background(), &mu, w.clock); !res.Quiet || !r.Quiet() {
		t.Fatal("a round with nothing at the edge is not quiet")
	}
	r.WantRead()
	if res := r.Run(context.Background(), &mu, w.clock); res.Quiet || r.Quiet() || res.After(cfg, w.now) > cfg.ReadEvery() {
		t.Fatalf("a failed read left the rounds quiet (%v), the next in %v", r.Quiet(), res.After(cfg, w.now))
	}
	st.fail = false
	w.now = w.now.Add(cfg.ReadEvery())
	if res := r.Run(context.Background(), &mu, w.clock); !res.Quiet || !r.View().Fresh(w.now, cfg.Trust()) {
		t.Fatalf("a read answered with nothing to read for: quiet %v, view fresh %v", res.Quiet, r.View().Fresh(w.now, cfg.Trust()))
	}
}
