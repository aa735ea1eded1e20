package sim

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// This file gives each simulated region the admission pipeline the agent
// runs (admission.Pipeline), on the region's clock, its lease and a model
// of its Redis: quota-lease's decisions in the simulator are the agent's
// code, only the store is simulated.

// errStoreDown is the simulated Redis's answer while it is down.
var errStoreDown = errors.New("simulated Redis is down")

// admitter decides a region's requests: its admission pipeline.
type admitter interface {
	Check(ctx context.Context, r admission.Request) (admission.Outcome, error)
}

// admitIn gives region r its admission pipeline.
func (e *engine) admitIn(r *region) error {
	p, err := admission.New(admission.Config{
		Policies: simPolicies{e}, Store: &simStore{e: e, r: r}, Shares: simShares{r}, Clock: regionClock{e, r},
		FallbackKeys: math.MaxInt, // the agent's table is large; the simulator never fills it
	})
	if err != nil {
		return err
	}
	r.admit = p
	if e.wrap != nil {
		r.admit = e.wrap(r, p)
	}
	return nil
}

// simPolicies is the one policy in force.
type simPolicies struct{ e *engine }

func (p simPolicies) Policy(name string) (*policy.Policy, bool) {
	return p.e.policy, name == p.e.policy.Name
}

// simShares is the region's lease (the region runs one agent instance).
type simShares struct{ r *region }

func (s simShares) Enforce(_, identity string, now time.Time) (int64, lease.Mode) {
	return s.r.holder.EnforceFor(identity, now)
}
func (s simShares) Instances() int { return 1 }

// regionClock reads region r's clock at the simulation's current time.
type regionClock struct {
	e *engine
	r *region
}

func (c regionClock) Now() time.Time { return c.r.leaseTime(c.e.now) }
func (c regionClock) Mono() time.Duration {
	return time.Duration(c.r.clock(c.e.now)) * time.Millisecond
}

// simStore is region r's Redis: down while an outage lasts, else deciding
// each ticket on the shard of its identity the region's turn picks, as
// regional.Engine does.
type simStore struct {
	e   *engine
	r   *region
	out []admission.Decided // reused: the simulator decides one request at a time
}

func (s *simStore) Decide(_ context.Context, ts []*admission.Ticket) []admission.Decided {
	out := slices.Grow(s.out[:0], len(ts))[:len(ts)]
	clear(out)
	s.out = out
	for i, t := range ts {
		if s.r.redisDown {
			out[i].Err = errStoreDown
			continue
		}
		id := s.e.ids.index[t.Identity]
		l := t.Policy.ShardLimits(t.Limits)
		out[i].Decision = s.e.decideStore(s.r, s.r.shardOf(id, t.Policy), l, s.r.clock(s.e.now), t.Cost*policy.Micro)
	}
	return out
}
