package agent

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/regional"
)

// storeWatch follows the region store's birth marker (regional.BornKey):
// it marks a store new the first time it reaches it (Engine.InitStore), and
// afterwards logs and counts every change of the marker, which means Redis
// lost what it held (a restart without persistence, a failover to an empty
// replica). The scripts themselves make keys lost that way start
// conservatively; this only makes it visible. Not safe for concurrent use:
// the presence loop owns it.
type storeWatch struct {
	engine *regional.Engine
	log    hclog.Logger
	losses prometheus.Counter // changes of the marker seen
	bornAt prometheus.Gauge   // the marker, in seconds

	initDone bool
	seen     bool  // a marker has been read
	born     int64 // the marker last read
	wait     int   // rounds until the marker is read again
}

// bornEvery is how many rounds (of a second) the watch lets pass between
// two reads of the marker. A loss only needs to be seen: the scripts make
// the keys it emptied start conservatively whether or not it is read, and
// an idle agent's wakeups cost more than their work (docs/benchmarks.md).
const bornEvery = 5

// round runs one round of w: at most one Redis round trip, bounded by ctx,
// and one every bornEvery rounds once the store is marked.
func (w *storeWatch) round(ctx context.Context) {
	if !w.initDone {
		isNew, err := w.engine.InitStore(ctx)
		if err != nil {
			w.log.Debug("store not marked yet", "error", err)
			return
		}
		w.initDone = true
		if isNew {
			w.log.Info("Redis holds no quota-lease state: marked as a new store")
		}
		if err := w.engine.LoadScripts(ctx); err != nil {
			w.log.Debug("scripts not loaded yet", "error", err)
		}
	}
	if w.wait > 0 {
		w.wait--
		return
	}
	born, err := w.engine.StoreBorn(ctx)
	if err != nil {
		return // unreachable
	}
	w.wait = bornEvery - 1
	if w.seen && born != w.born {
		w.losses.Inc()
		w.log.Warn("Redis lost its quota-lease state; each identity starts as if it had used its whole "+
			"share at the loss (docs/failure-modes.md)",
			"lost_at", time.UnixMilli(born).UTC().Format(time.RFC3339Nano))
	}
	w.seen, w.born = true, born
	w.bornAt.Set(float64(born) / 1000)
}
