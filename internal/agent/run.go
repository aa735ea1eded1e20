package agent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// What the agent does over time: its loops (leases, presence, policies),
// the region's saved state at start and as it goes, and its drain.

// Run loads policies, leases, and keeps doing both until ctx ends; then it
// removes this process's heartbeat, so a restart takes its instance name at
// once (succession.go), and stops the engine's pipeline senders (checks
// after that go to Redis one by one). At start
// it restores the region's saved state (policies and grants) when the
// coordinator cannot give them, so an agent serves its region's grants and
// degraded budgets within a second of starting during an outage. It
// returns an error only when a policy file cannot be loaded at start.
func (a *Agent) Run(ctx context.Context) error {
	defer a.engine.Close()
	store := &storeWatch{engine: a.engine, log: a.cfg.Logger, losses: a.m.storeLosses, bornAt: a.m.storeBorn}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	a.health.record(sctx, a.pingRedis(sctx))
	store.round(sctx) // before the first check where Redis is up; else the presence loop retries
	fromSaved := a.restorePolicies(sctx)
	cancel()
	if !fromSaved {
		if err := a.loadPolicies(ctx); err != nil {
			if !a.cfg.KeepPolicies {
				return err
			}
			saved := "the region's Redis holds no saved set"
			if rerr := a.health.last(); rerr != nil {
				saved = "the region's saved set cannot be read: " + redisProblem(rerr)
			}
			a.cfg.Logger.Warn("no policies yet: the coordinator is unreachable and "+saved+
				"; retrying every second (not ready meanwhile)", "error", err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	a.restoreGrants(rctx, true)
	cancel()
	var wg sync.WaitGroup
	wg.Add(5)
	go func() { defer wg.Done(); a.edge.Run(ctx) }()
	go func() { defer wg.Done(); a.leaseLoop(ctx) }()
	go func() { defer wg.Done(); a.presenceLoop(ctx, store) }()
	go func() { defer wg.Done(); a.probe().run(ctx) }()
	go func() { defer wg.Done(); a.refreshLoop(ctx, fromSaved) }()
	wg.Wait()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := a.edge.Leave(lctx); err != nil {
		a.cfg.Logger.Debug("the region's edge reservations of this agent stay for their usual life", "error", err)
	}
	if err := a.shared.Leave(lctx, a.leaser.nonce); err != nil {
		a.cfg.Logger.Debug("a restart under this instance name waits for the heartbeat to go stale", "error", err)
	}
	return nil
}

// refreshLoop reloads the policies every PolicyRefresh, when a check names
// an unknown policy or a grant comes from a changed one, and every second
// while the agent runs on a saved set or none.
func (a *Agent) refreshLoop(ctx context.Context, fromSaved bool) {
	t := time.NewTicker(a.cfg.PolicyRefresh)
	defer t.Stop()
	pending := fromSaved || !a.loaded.Load() // the coordinator's set is still to come
	for {
		if !pending {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-a.refresh: // an unknown policy was named, or a grant came from a changed one
			}
		}
		err := a.loadPolicies(ctx)
		switch {
		case err == nil && pending:
			a.cfg.Logger.Info("policies loaded from the coordinator", "policies", len(a.leaser.names()))
			pending = false
		case err != nil && ctx.Err() == nil && !pending:
			a.cfg.Logger.Warn("policy refresh failed; keeping the current set", "error", err)
		}
		select { // at most one refresh per second, however many checks ask
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// Drain marks the agent not ready, keeps serving for delay (so that load
// balancers watching /readyz stop sending first), then ends its RLQS
// streams (Envoy reopens them elsewhere) and waits until no check is in
// flight, or ctx ends. Checks that still arrive are decided as usual.
func (a *Agent) Drain(ctx context.Context, delay time.Duration) {
	a.closing.Store(true)
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return
	}
	a.edge.EndStreams()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for a.inflight.Load() > 0 {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (a *Agent) loadPolicies(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ps, err := a.cfg.Policies(lctx)
	if err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	if err := a.installPolicies(ps); err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	if a.cfg.KeepPolicies {
		a.savePolicies(lctx, ps)
	}
	return nil
}

func (a *Agent) leaseLoop(ctx context.Context) {
	for {
		// A round may take until the next renewal would be due (a third
		// of a lease): time for the client to give up on a hung replica
		// and reach another, and for large renewals split in several
		// requests. Not a fixed few hundred ms.
		rctx, cancel := context.WithTimeout(ctx, max(a.cfg.RenewTick*5, a.leaser.renewInterval()))
		a.leaser.renew(rctx, a.edge)
		cancel()
		now := a.cfg.Clock.Now()
		a.leaser.updateMetrics(now)
		// Until the next renewal falls due, or policies are installed (a
		// new one wants its lease), at least about a RenewTick: an idle
		// agent wakes for its renewals only (the presence loop keeps the
		// lease gauges current).
		wait := time.Minute
		if at, ok := a.leaser.renewAt(); ok {
			wait = min(wait, at.Sub(now))
		}
		wait = max(wait, time.Duration(float64(a.cfg.RenewTick)*(0.5+rand.Float64())))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-a.renew:
		}
	}
}

func (a *Agent) presenceLoop(ctx context.Context, store *storeWatch) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	decay := 0
	wasReady, wasWhy := false, ""
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := a.leaser.publish(pctx, 3*time.Second)
		a.health.record(pctx, err)
		if err == nil {
			a.saveState(pctx)
		}
		store.round(pctx)
		cancel()
		a.m.breakerOpen.Set(boolGauge(a.admit.BreakerOpen()))
		a.leaser.updateMetrics(a.cfg.Clock.Now())
		if decay++; decay%30 == 0 {
			a.hot.decay()
		}
		if ok, why := a.Readiness(); (ok != wasReady || why != wasWhy) && a.cfg.OnReadiness != nil {
			wasReady, wasWhy = ok, why
			a.cfg.OnReadiness(ok, why)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// restorePolicies installs the region's saved policy set when the agent
// keeps its policies in Redis (Config.KeepPolicies) and reports whether it
// did. Run calls it before asking the coordinator, so a start during an
// outage serves at once; the coordinator's set replaces it when it comes.
func (a *Agent) restorePolicies(ctx context.Context) bool {
	if !a.cfg.KeepPolicies {
		return false
	}
	ps, ok, err := a.shared.LoadPolicies(ctx)
	switch {
	case err != nil:
		a.cfg.Logger.Warn("the region's saved policies are not readable; asking the coordinator", "error", err)
		return false
	case !ok:
		return false
	}
	if err := a.installPolicies(ps); err != nil {
		a.cfg.Logger.Warn("the region's saved policies are refused; asking the coordinator", "error", err)
		return false
	}
	a.savedFP = policySetFingerprint(ps)
	a.cfg.Logger.Info("started from the region's saved policies; the coordinator's replace them when it "+
		"answers", "policies", len(ps))
	return true
}

// restoreGrants installs the region's saved grants (leaser.restoreGrants);
// at start it logs what each global policy starts from.
func (a *Agent) restoreGrants(ctx context.Context, atStart bool) {
	n, err := a.leaser.restoreGrants(ctx, a.cfg.SavedClockSkew)
	if err != nil {
		if atStart {
			a.cfg.Logger.Warn("the region's saved grants are not readable", "error", err)
		}
		return
	}
	if atStart && n > 0 {
		a.cfg.Logger.Info("restored the region's saved grants: enforcing each until it ends, then its degraded "+
			"budget, until the coordinator grants anew",
			"grants", n, "global_policies", len(a.leaser.names()))
	}
}

// savePolicies saves ps as the region's policy set when it differs from
// the set last saved.
func (a *Agent) savePolicies(ctx context.Context, ps []*policy.Policy) {
	fp := policySetFingerprint(ps)
	if fp == a.savedFP {
		return
	}
	if err := a.shared.SavePolicies(ctx, ps); err != nil {
		a.cfg.Logger.Debug("policies not saved", "error", err)
		return
	}
	a.savedFP = fp
	a.prune.Store(true)
}

// saveState saves this process's changed grants, prunes those of deleted
// policies after a change of the set, and follows the saved grants where
// this process holds none of its own.
func (a *Agent) saveState(ctx context.Context) {
	if err := a.leaser.saveGrants(ctx, a.prune.Swap(false)); err != nil {
		a.cfg.Logger.Debug("grants not saved", "error", err)
	}
	a.restoreGrants(ctx, false)
}
