package sim

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge"
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

// admitIn gives region r its admission pipeline: the agent's, with its
// defaults but for what the simulated store makes moot or the simulator
// leaves out (simConfig).
func (e *engine) admitIn(r *region) error {
	p, err := admission.New(simConfig(simPolicies{e}, &simStore{e: e, r: r}, simShares{r}, regionClock{e, r}))
	if err != nil {
		return err
	}
	r.admit = p
	if e.wrap != nil {
		r.admit = e.wrap(r, p)
	}
	return nil
}

// simConfig is a simulated region's pipeline configuration: the agent's
// defaults (admission.DefaultConfig), except that the simulated store
// answers at once or is down at once (no timeout, no breaker: after an
// outage the agent's breaker keeps checks on the fallback up to a second
// longer, which the simulator does not model), no request carries an
// idempotency key (no replay cache), the over-limit cache is left out (it
// only saves the store work, answering as it would) and the fallback's
// table never fills.
func simConfig(p admission.Policies, st admission.Store, sh admission.Shares, c clock.Clock) admission.Config {
	cfg := admission.DefaultConfig()
	cfg.Policies, cfg.Store, cfg.Shares, cfg.Clock = p, st, sh, c
	cfg.StoreTimeout, cfg.BreakerThreshold, cfg.ReplayKeys, cfg.OverLimitKeys = 0, 0, 0, 0
	cfg.FallbackKeys = math.MaxInt
	return cfg
}

// simPolicies is the one policy in force.
type simPolicies struct{ e *engine }

func (p simPolicies) Policy(name string) (*policy.Policy, bool) {
	return p.e.policy, name == p.e.policy.Name
}

// simShares is the region's lease (the region runs one agent instance).
type simShares struct{ r *region }

func (s simShares) Enforce(_, identity string, now time.Time) (int64, lease.Mode) {
	amount, mode := s.r.holder.Enforce(identity, now)
	if s.r.edge == nil || s.r.edge.e.breakEdge == "reservations" {
		return amount, mode
	}
	// The agent's edgeShares: direct checks leave the edge its part.
	return edge.DirectShare(amount, s.r.edge.reserved(identity, now)), mode
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
