package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/lease"
)

// Coordinator is one coordinator replica. Run campaigns for leadership and,
// while leader, serves leases; followers refuse lease calls with the
// leader's address.
type Coordinator struct {
	cfg  Config
	cli  *clientv3.Client
	log  hclog.Logger
	keys keys
	// refused counts calls Authorize refused.
	refused *refusals
	// etcdWrite times ledger transactions (exported with /metrics).
	etcdWrite prometheus.Histogram
	// leaseCalls limits each region identity's Lease calls.
	leaseCalls *callRate
	// clusterID is the deployment's ID (*string), once loaded.
	clusterID atomic.Pointer[string]
	// etcd is what this replica's etcd calls last found.
	etcd *etcdHealth
	// xdsMetrics count the xDS subscription's responses (Config.RateLimitXDS).
	xdsMetrics *ratelimitxds.Metrics

	mu     sync.RWMutex
	cur    *leaderTerm  // nil unless leader and ready
	leader atomic.Value // string: the leader's advertised address, as observed

	grants   atomic.Int64 // lease answers given, for metrics and benchmarks
	persists atomic.Int64 // ledger writes made
	// compacted is the etcd revision this replica last compacted up to.
	compacted atomic.Int64
}

// leaderTerm is one period of leadership.
type leaderTerm struct {
	epoch     int64
	leaderKey string
	leaderRev int64
	lease     *leaderLease

	// serving is read-held by every handler that may grant, and
	// write-held by stepDown, so a replica that steps down has finished
	// every grant before it gives up its session.
	serving sync.RWMutex

	mu     sync.RWMutex // guards the maps and paused
	quotas map[string]*quotaState
	// retired are deleted policies' quotas whose grants may still be
	// enforced by agents: a policy recreated under the same name starts
	// with them reserved (quotaState.inherit), so deleting and recreating it
	// (the way to change its algorithm) cannot grant the limit twice.
	retired map[string]*quotaState
	// sources say who manages each policy not set by hand (an xDS server).
	sources map[string]*policySource
	regions map[string]regionRecord
	paused  bool
	now     chan struct{} // rebalance now
	// claims are the agent processes holding the instance names.
	claims *instanceClaims
}

// IsLeader reports whether this replica leads and serves leases.
func (c *Coordinator) IsLeader() bool { return c.currentTerm() != nil }

// Epoch returns the current leader epoch of this replica (0 if follower).
func (c *Coordinator) Epoch() int64 {
	if t := c.currentTerm(); t != nil {
		return t.epoch
	}
	return 0
}

// Leader returns the advertised address of the replica this one last saw
// leading (its own while it leads; empty before any election is seen).
func (c *Coordinator) Leader() string {
	l, _ := c.leader.Load().(string)
	return l
}

// Replica returns this replica's name (Config.Name).
func (c *Coordinator) Replica() string { return c.cfg.Name }

// Stats returns how many lease answers this replica gave and how many
// ledger writes it made.
func (c *Coordinator) Stats() (grants, persists int64) { return c.grants.Load(), c.persists.Load() }

func (c *Coordinator) currentTerm() *leaderTerm {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cur
}

func (c *Coordinator) observe(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			c.leader.Store(string(resp.Kvs[0].Value))
		}
	}
}

// stepDown stops serving: it waits for handlers that may grant to finish
// before the session is released by the caller.
func (c *Coordinator) stepDown() {
	c.mu.Lock()
	t := c.cur
	c.cur = nil
	c.mu.Unlock()
	if t != nil {
		t.serving.Lock()
		t.serving.Unlock() // only a barrier: every in-flight grant is done
		c.log.Info("stepped down", "epoch", t.epoch)
	}
}

func (t *leaderTerm) isPaused() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.paused
}

func (t *leaderTerm) regionNames() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	names := make([]string, 0, len(t.regions))
	for n := range t.regions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (c *Coordinator) rebalanceAll(t *leaderTerm) {
	t.mu.RLock()
	regions := make(map[string]regionRecord, len(t.regions))
	for k, v := range t.regions {
		regions[k] = v
	}
	quotas := make([]*quotaState, 0, len(t.quotas))
	for _, q := range t.quotas {
		quotas = append(quotas, q)
	}
	t.mu.RUnlock()
	for _, q := range quotas {
		q.mu.Lock()
		opts := lease.PlanOptions{Strategy: c.cfg.Strategy, MaxStep: c.cfg.MaxStep, Hysteresis: c.cfg.Hysteresis}
		if err := q.rebalance(regions, opts); err != nil {
			c.log.Warn("rebalance skipped", "error", err)
		}
		q.mu.Unlock()
	}
}

// errNotLeader reports a write refused because leadership moved.
var errNotLeader = errors.New("this replica is no longer the leader")

// txn applies ops only if this replica still holds the leadership key.
func (c *Coordinator) txn(ctx context.Context, t *leaderTerm, ops ...clientv3.Op) error {
	for len(ops) > 0 {
		n := min(len(ops), 100) // etcd's default --max-txn-ops is 128
		t0 := c.cfg.Clock.Mono()
		var resp *clientv3.TxnResponse
		err := c.etcdCall(ctx, "write a transaction", func(ctx context.Context) (err error) {
			resp, err = c.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(t.leaderKey), "=", t.leaderRev)).
				Then(ops[:n]...).
				Commit()
			return err
		})
		c.etcdWrite.Observe((c.cfg.Clock.Mono() - t0).Seconds())
		if err != nil {
			return fmt.Errorf("etcd txn: %w", err)
		}
		if !resp.Succeeded {
			return errNotLeader
		}
		c.persists.Add(1)
		ops = ops[n:]
	}
	return nil
}

// flushLowered writes lowered high-water marks and deletes ledger entries of
// leases that are over: one batched transaction per quota, made while
// holding the quota's lock so that no grant raises a mark in between.
func (c *Coordinator) flushLowered(ctx context.Context, t *leaderTerm) error {
	t.mu.RLock()
	quotas := make(map[string]*quotaState, len(t.quotas))
	for k, v := range t.quotas {
		quotas[k] = v
	}
	retired := make(map[string]*quotaState, len(t.retired))
	for k, v := range t.retired {
		retired[k] = v
	}
	t.mu.RUnlock()
	c.forgetRetired(t, retired)
	var errs []error
	for name, q := range quotas {
		if err := c.flushQuota(ctx, t, name, q); err != nil {
			errs = append(errs, fmt.Errorf("quota %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// forgetRetired drops the deleted policies' books once nothing they
// granted can count any more.
func (c *Coordinator) forgetRetired(t *leaderTerm, retired map[string]*quotaState) {
	now := c.cfg.Clock.Now()
	for name, q := range retired {
		q.mu.Lock()
		q.book.Prune(now)
		done := q.book.Idle(now)
		q.mu.Unlock()
		if !done {
			continue
		}
		t.mu.Lock()
		if t.retired[name] == q { // not recreated and deleted again meanwhile
			delete(t.retired, name)
		}
		t.mu.Unlock()
	}
}

func (c *Coordinator) flushQuota(ctx context.Context, t *leaderTerm, name string, q *quotaState) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.book.Flush(c.cfg.Clock.Now())
	if d.Empty() {
		return nil
	}
	return c.writeLedger(ctx, t, ledgerWrite{name, q.book, d})
}

// ledgerWrite is one quota's ledger change (lease.LedgerDelta), with the book to
// tell once it is written.
type ledgerWrite struct {
	quota string
	book  *lease.Book
	delta lease.LedgerDelta
}

// writeLedger turns ws into etcd operations, writes them in one
// transaction (lowerings and deletions before raisings, should it have to
// be split), and tells each book what was written. The caller holds every
// quota's lock.
func (c *Coordinator) writeLedger(ctx context.Context, t *leaderTerm, ws ...ledgerWrite) error {
	var lower, raise []clientv3.Op
	for _, w := range ws {
		for _, region := range w.delta.Delete {
			lower = append(lower, clientv3.OpDelete(c.keys.ledgerEntry(w.quota, region)))
		}
		for _, m := range w.delta.Lower {
			lower = append(lower, c.markOp(t, w.quota, m))
		}
		for _, m := range w.delta.Raise {
			raise = append(raise, c.markOp(t, w.quota, m))
		}
	}
	if len(lower)+len(raise) == 0 {
		return nil
	}
	if err := c.txn(ctx, t, append(lower, raise...)...); err != nil {
		return err
	}
	for _, w := range ws {
		w.book.Written(w.delta)
	}
	return nil
}

// markOp writes mark m of quota: the one form of a ledger record.
func (c *Coordinator) markOp(t *leaderTerm, quota string, m lease.LedgerMark) clientv3.Op {
	return clientv3.OpPut(c.keys.ledgerEntry(quota, m.Region), mustJSON(ledgerRecord{
		Instance: m.Instance,
		Nonce:    m.Nonce,
		GrantID:  m.GrantID,
		Amount:   m.Amount,
		Total:    m.Total,
		Epoch:    t.epoch,
	}))
}

// etcdCall runs one etcd call, op, with a deadline of its own: the
// configured etcd timeout, shortened to most of what is left of ctx's
// deadline, so that a handler still has time to say that etcd did not
// answer before its caller gives up. It returns an *EtcdError for a
// failure that is etcd's (not for ctx ending, nor a bad record), and
// records the outcome in the replica's etcd health: every success, and
// the failures of calls that had the whole etcd timeout (a caller's short
// deadline says little about etcd).
//
// A call on behalf of a caller with a deadline (a handler's) is not made
// while the replica's own calls find etcd failing: it fails at once with
// their error, so that a client retrying within its deadline gets that
// answer, not a timeout. The replica's own calls (keepalives, the
// leadership cycle), which have no caller's deadline, notice the recovery.
func (c *Coordinator) etcdCall(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	timeout := c.cfg.EtcdTimeout
	if dl, ok := ctx.Deadline(); ok {
		if last := c.etcd.last(); last != nil {
			return &EtcdError{Op: op, Endpoints: last.Endpoints, Err: last.Err}
		}
		timeout = min(timeout, time.Until(dl)*4/5)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := fn(cctx)
	switch {
	case err == nil:
		c.etcd.record(nil)
		return nil
	case ctx.Err() != nil:
		return err // the caller gave up or is shutting down: not etcd's fault
	case !isEtcdFailure(err):
		c.etcd.record(nil) // etcd answered; what it said is the caller's to judge
		return err
	}
	e := &EtcdError{Op: op, Endpoints: c.etcd.endpoints, Err: err}
	if timeout == c.cfg.EtcdTimeout {
		c.etcd.record(e)
	}
	return e
}
