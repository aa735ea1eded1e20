package coordinator

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/policy"
)

// The leader subscribes to the xDS management server of Config.RateLimitXDS
// for as long as it leads, and stores each response as policies through
// changePolicies, as quota set stores a file: etcd stays the one place
// policies live, and agents get them from the coordinator as any other.
// A follower does not subscribe; a new leader subscribes afresh, and is
// sent the whole state, which it compares with what etcd holds.

// runXDS subscribes for term t until ctx ends, in a goroutine; wait waits
// for it to stop.
func (c *Coordinator) runXDS(ctx context.Context, t *leaderTerm) (wait func()) {
	if c.cfg.RateLimitXDS == nil {
		return func() {}
	}
	cl, err := ratelimitxds.NewClient(*c.cfg.RateLimitXDS, c.applyXDS(t), c.log.Named("xds"), c.xdsMetrics)
	if err != nil { // ValidateConfig checked the settings
		c.log.Error("xDS subscription not started", "error", err)
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl.Run(ctx)
	}()
	return wg.Wait
}

// applyXDS stores one converted response in term t: the policies it adds
// or changes, and the deletion of every policy the server managed that it
// no longer sends (state of the world: a response is the whole
// configuration, and envoyproxy/ratelimit too stops enforcing a limit it is
// no longer sent). Policies it sends unchanged are not written. A change
// that cannot be stored (a policy set by hand of the same name, a limit
// too small for the regions) is rejected whole: nothing is written, and
// the server is told why.
func (c *Coordinator) applyXDS(t *leaderTerm) ratelimitxds.Applier {
	s := c.cfg.RateLimitXDS
	return func(ctx context.Context, cfg ratelimitxds.Config) error {
		t.mu.Lock()
		defer t.mu.Unlock()
		ch := policyChange{replace: true, source: func(name string) *policySource {
			return &policySource{
				Source:   sourceXDS,
				Server:   s.Server,
				Node:     s.NodeID,
				Resource: cfg.Resource[name],
				Version:  cfg.Version,
			}
		}}
		sent := make(map[string]bool, len(cfg.Policies))
		for _, p := range cfg.Policies {
			sent[p.Name] = true
			q, src := t.quotas[p.Name], t.sources[p.Name]
			if q != nil && src != nil && src.Resource == cfg.Resource[p.Name] && samePolicy(q.policy, p) {
				continue
			}
			ch.set = append(ch.set, p)
		}
		for name, src := range t.sources {
			if src.Source == sourceXDS && !sent[name] && t.quotas[name] != nil {
				ch.del = append(ch.del, name)
			}
		}
		err := c.changePolicies(ctx, t, ch)
		switch {
		case err == nil:
			c.log.Info("xDS configuration applied", "version", cfg.Version, "policies", len(cfg.Policies),
				"changed", len(ch.set), "deleted", len(ch.del))
			return nil
		case status.Code(err) == codes.Unavailable:
			return err
		default:
			return ratelimitxds.Reject(errors.New(status.Convert(err).Message()))
		}
	}
}

// samePolicy reports whether two policies are the same in every field.
func samePolicy(a, b *policy.Policy) bool { return mustJSON(a) == mustJSON(b) }
