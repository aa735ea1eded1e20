package agent

import (
	"context"
	"time"
)

// storeWatch follows the region store's birth marker (regional.BornKey):
// it marks a store new the first time it reaches it (Engine.InitStore), and
// afterwards logs and counts every change of the marker, which means Redis
// lost what it held (a restart without persistence, a failover to an empty
// replica). The scripts themselves make keys lost that way start
// conservatively; this only makes it visible. Not safe for concurrent use:
// the presence loop owns it.
type storeWatch struct {
	initDone bool
	seen     bool  // a marker has been read
	born     int64 // the marker last read
}

// watchStore runs one round of w: at most one Redis round trip, bounded by ctx.
func (a *Agent) watchStore(ctx context.Context, w *storeWatch) {
	if !w.initDone {
		isNew, err := a.engine.InitStore(ctx)
		if err != nil {
			a.cfg.Logger.Debug("store not marked yet", "error", err)
			return
		}
		w.initDone = true
		if isNew {
			a.cfg.Logger.Info("Redis holds no quota-lease state: marked as a new store")
		}
		if err := a.engine.LoadScripts(ctx); err != nil {
			a.cfg.Logger.Debug("scripts not loaded yet", "error", err)
		}
	}
	born, err := a.engine.StoreBorn(ctx)
	if err != nil {
		return // unreachable
	}
	if w.seen && born != w.born {
		a.m.storeLosses.Inc()
		a.cfg.Logger.Warn("Redis lost its quota-lease state; each identity starts as if it had used its whole "+
			"share at the loss (docs/failure-modes.md)",
			"lost_at", time.UnixMilli(born).UTC().Format(time.RFC3339Nano))
	}
	w.seen, w.born = true, born
	a.m.storeBorn.Set(float64(born) / 1000)
}
