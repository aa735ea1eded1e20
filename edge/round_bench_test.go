package edge

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// BenchmarkRounds is an agent's edge rounds over 1,000 identities, each
// reported by one Envoy instance every 5 s at 2 requests a second (the
// 1,000-bucket shape of the edge's peer benchmark, BenchmarkEdgePeers):
// one op is a minute of rounds as the agent's timer runs them, on a store
// in memory. It reports the identities planned, the actions sent and the
// reservation updates written per op.
func BenchmarkRounds(b *testing.B) {
	p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: 100000,
		Period: policy.Duration(time.Second), Edge: &policy.Edge{Instances: 100, NoAssignment: policy.EdgeDeny}}
	p.Normalize()
	if err := p.Validate(); err != nil {
		b.Fatal(err)
	}
	const keys, every = 1000, 5 * time.Second
	ids := make([]ID, keys)
	for i := range ids {
		ids[i] = ID{p.Name, fmt.Sprint("tenant=t", i)}
	}
	var plans, sends, writes int
	for b.Loop() {
		rng := rand.New(rand.NewPCG(1, 2))
		w := newRoundWorld(p, func(time.Duration) int64 { return p.Limits().Amount() })
		w.renewEvery = 3 * time.Second // leases of 10 s, renewed a third of the way
		st := &countingStore{Store: NewMemStore(w.ms).Agent("a", "")}
		r := NewRound(Config{Tuning: DefaultTuning(), Drift: 1e-4}, cmp.Compare[int], w, st, w)
		r.SetPolicies([]*policy.Policy{p})
		var mu sync.Mutex
		var roundAt time.Duration
		for at := time.Duration(0); at < time.Minute; at += time.Millisecond {
			w.now = w.start.Add(at)
			// Reports come in id order, one every interval/keys; a new
			// slot asks for a round at once, as the agent's does.
			if i := int(at % every * keys / every); at%(every/keys) == 0 {
				k := r.Key(ids[i], p)
				s := k.Slots[0]
				if s == nil {
					s, roundAt = k.Add(0, w.now), at
				}
				s.Report(p, uint64(poisson(rng, 10)), every, w.now)
				k.Touch()
			}
			if at >= roundAt {
				res := r.Run(context.Background(), &mu, w.clock)
				plans += res.Planned
				roundAt = at + res.After(r.cfg, w.now).Truncate(time.Millisecond)
			}
		}
		sends += len(w.sent)
		writes += st.writes
	}
	b.ReportMetric(float64(plans)/float64(b.N), "plans/op")
	b.ReportMetric(float64(sends)/float64(b.N), "sends/op")
	b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
}

// countingStore counts the updates written to its Store.
type countingStore struct {
	Store
	writes int
}

func (c *countingStore) Sync(ctx context.Context, writes []Write, read bool, alive time.Duration) (SyncAnswer, error) {
	c.writes += len(writes)
	return c.Store.Sync(ctx, writes, read, alive)
}

// poisson draws a count of arrivals at mean (Knuth's method: small means).
func poisson(r *rand.Rand, mean float64) int {
	l, n, p := math.Exp(-mean), 0, 1.0
	for p *= r.Float64(); p > l; p *= r.Float64() {
		n++
	}
	return n
}
