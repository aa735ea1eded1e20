package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/lease"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
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
	cur    *term        // nil unless leader and ready
	leader atomic.Value // string: the leader's advertised address, as observed

	grants   atomic.Int64 // lease answers given, for metrics and benchmarks
	persists atomic.Int64 // ledger writes made
	// compacted is the etcd revision this replica last compacted up to.
	compacted atomic.Int64
}

// term is one period of leadership.
type term struct {
	epoch     int64
	leaderKey string
	leaderRev int64
	lease     *leaderLease

	// serving is read-held by every handler that may grant, and
	// write-held by stepDown, so a replica that steps down has finished
	// every grant before it gives up its session.
	serving sync.RWMutex

	mu     sync.RWMutex // guards the maps and paused
	quotas map[string]*quota
	// retired are deleted policies' quotas whose grants may still be
	// enforced by agents: a policy recreated under the same name starts
	// with them reserved (quota.inherit), so deleting and recreating it
	// (the way to change its algorithm) cannot grant the limit twice.
	retired map[string]*quota
	// sources say who manages each policy not set by hand (an xDS server).
	sources map[string]*policySource
	regions map[string]regionRecord
	paused  bool
	now     chan struct{} // rebalance now
	// claims are the agent processes holding the instance names.
	claims *instanceClaims
}

// New returns a coordinator replica using cli for etcd.
func New(cli *clientv3.Client, cfg Config) (*Coordinator, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, fmt.Errorf("coordinator config: %w", err)
	}
	cfg.Prefix = strings.TrimRight(cfg.Prefix, "/")
	c := &Coordinator{cfg: cfg, cli: cli, log: cfg.Logger, keys: keys{cfg.Prefix}, refused: &refusals{},
		leaseCalls: &callRate{rate: cfg.LeaseCallRate, by: map[string]*rate.Limiter{}},
		etcdWrite: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quotalease_coordinator_etcd_write_seconds",
			Help:    "Latency of the leader's ledger transactions in etcd (a renewal that raises a mark waits for one).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}})}
	c.xdsMetrics = ratelimitxds.NewMetrics()
	c.etcd = newEtcdHealth(cli.Endpoints(), cfg.Logger, cfg.Clock)
	c.leader.Store("")
	return c, nil
}

// Register adds the lease and admin services to s.
func (c *Coordinator) Register(s *grpc.Server) {
	pb.RegisterLeaseServiceServer(s, c.Leases())
	pb.RegisterAdminServiceServer(s, c.Admin())
}

// Leases is this replica's LeaseService.
func (c *Coordinator) Leases() *LeaseService { return &LeaseService{c: c} }

// Admin is this replica's AdminService.
func (c *Coordinator) Admin() *AdminService { return &AdminService{c: c} }

// IsLeader reports whether this replica leads and serves leases.
func (c *Coordinator) IsLeader() bool { return c.term() != nil }

// Epoch returns the current leader epoch of this replica (0 if follower).
func (c *Coordinator) Epoch() int64 {
	if t := c.term(); t != nil {
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

// Name returns this replica's name (Config.Name).
func (c *Coordinator) Name() string { return c.cfg.Name }

// Stats returns how many lease answers this replica gave and how many
// ledger writes it made.
func (c *Coordinator) Stats() (grants, persists int64) { return c.grants.Load(), c.persists.Load() }

func (c *Coordinator) term() *term {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cur
}

// Run campaigns for leadership and leads when elected, until ctx ends. On
// return this replica has stepped down and released its session, so a
// follower takes over at once.
func (c *Coordinator) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := c.ensureClusterID(ctx) // before leading: a leader always stamps its answers
		if err == nil {
			err = c.campaign(ctx)
		}
		if err != nil && ctx.Err() == nil {
			var ee *EtcdError
			if !errors.As(err, &ee) { // etcd failures are logged paced by etcdCall
				c.log.Error("leadership cycle ended", "error", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func (c *Coordinator) campaign(ctx context.Context) error {
	ll := &leaderLease{}
	sent := c.cfg.Clock.Mono()
	// The session's lease is granted here, within the etcd timeout:
	// concurrency.NewSession would wait for an unreachable etcd forever.
	var granted *clientv3.LeaseGrantResponse
	if err := c.etcdCall(ctx, "open a leadership session", func(ctx context.Context) (err error) {
		granted, err = c.cli.Grant(ctx, int64(c.cfg.SessionTTL/time.Second))
		return err
	}); err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	sess, err := concurrency.NewSession(c.cli, concurrency.WithLease(granted.ID), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	defer sess.Close()
	ll.extend(sent, c.cfg.SessionTTL, c.cfg.Timing.Drift, c.cfg.Timing.Margin)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // the session ending ends everything below
		select {
		case <-sess.Done():
			cancel()
		case <-sctx.Done():
		}
	}()
	go c.keepAlive(sctx, sess.Lease(), ll)
	el := concurrency.NewElection(sess, c.keys.election())
	go c.observe(sctx, el)

	c.log.Info("campaigning for leadership", "name", c.cfg.Name)
	if err := el.Campaign(sctx, c.cfg.Advertise); err != nil {
		if ctx.Err() == nil && sctx.Err() != nil { // the session ended: its keepalives failed, as the log says
			return &EtcdError{Op: "campaign for leadership", Endpoints: c.etcd.endpoints, Err: errors.New("the leadership session expired")}
		}
		return fmt.Errorf("campaign: %w", err)
	}
	err = c.lead(sctx, el, ll)
	c.stepDown()
	if ctx.Err() == nil && sctx.Err() != nil {
		c.log.Warn("lost etcd session: stepped down")
	}
	// Hand over at once: resign and revoke the session with a context of
	// their own. ctx is done on shutdown, and a session closed with it
	// would leave the election key to expire only after the session TTL,
	// every region waiting that long for a successor. A closed client
	// cannot resign, and its calls would only retry until the timeout.
	if c.cli.Ctx().Err() != nil {
		return err
	}
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	if rerr := el.Resign(rctx); rerr == nil {
		_, _ = c.cli.Revoke(rctx, sess.Lease())
		c.log.Info("resigned leadership")
	}
	rcancel()
	return err
}

func (c *Coordinator) observe(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			c.leader.Store(string(resp.Kvs[0].Value))
		}
	}
}

// lead loads the state, restores the ledger and serves until ctx ends.
func (c *Coordinator) lead(ctx context.Context, el *concurrency.Election, ll *leaderLease) error {
	st, err := c.readState(ctx)
	if err != nil {
		return err
	}
	t := &term{epoch: el.Rev(), leaderKey: el.Key(), leaderRev: el.Rev(), lease: ll,
		quotas: map[string]*quota{}, retired: map[string]*quota{}, sources: map[string]*policySource{}, regions: st.regions, paused: st.paused, now: make(chan struct{}, 1),
		claims: newInstanceClaims(c.cfg.Timing.ValidFor)}
	if len(t.regions) == 0 && len(c.cfg.Regions) > 0 {
		var ops []clientv3.Op
		for _, r := range c.cfg.Regions {
			rec := regionRecord{Name: r, Weight: 1}
			t.regions[r] = rec
			ops = append(ops, clientv3.OpPut(c.keys.region(r), mustJSON(rec)))
		}
		if err := c.txn(ctx, t, ops...); err != nil {
			return fmt.Errorf("declare regions: %w", err)
		}
	}
	now := c.cfg.Clock.Now()
	restored := 0
	for name, p := range st.policies {
		q := newQuota(p, c.cfg.Timing, t.epoch)
		for region, rec := range st.ledger[name] {
			q.book.Restore(region, rec.Instance, rec.Nonce, rec.GrantID, rec.Amount, rec.Total, now)
			restored++
		}
		t.quotas[name] = q
		if src := st.sources[name]; src != nil {
			t.sources[name] = src
		}
	}
	c.mu.Lock()
	c.cur = t
	c.mu.Unlock()
	c.leader.Store(c.cfg.Advertise)
	c.log.Info("leading", "epoch", t.epoch, "policies", len(t.quotas), "regions", len(t.regions), "restored_grants", restored)

	c.rebalanceAll(t)
	defer c.runXDS(ctx, t)()
	reb := time.NewTicker(c.cfg.RebalanceInterval)
	defer reb.Stop()
	flush := time.NewTicker(c.cfg.FlushInterval)
	defer flush.Stop()
	compactions, stopCompactions := compactTicker(c.cfg.CompactionInterval)
	defer stopCompactions()
	var cp compactor
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reb.C:
			if !t.isPaused() {
				c.rebalanceAll(t)
			}
		case <-t.now:
			c.rebalanceAll(t)
		case <-flush.C:
			if err := c.flush(ctx, t); err != nil && ctx.Err() == nil {
				c.log.Warn("ledger flush failed; will retry", "error", err)
			}
		case <-compactions:
			c.compact(ctx, &cp)
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

func (t *term) isPaused() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.paused
}

func (t *term) regionNames() []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	names := make([]string, 0, len(t.regions))
	for n := range t.regions {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (c *Coordinator) rebalanceAll(t *term) {
	t.mu.RLock()
	regions := make(map[string]regionRecord, len(t.regions))
	for k, v := range t.regions {
		regions[k] = v
	}
	quotas := make([]*quota, 0, len(t.quotas))
	for _, q := range t.quotas {
		quotas = append(quotas, q)
	}
	t.mu.RUnlock()
	for _, q := range quotas {
		q.mu.Lock()
		if err := q.rebalance(regions, lease.PlanOptions{Strategy: c.cfg.Strategy, MaxStep: c.cfg.MaxStep, Hysteresis: c.cfg.Hysteresis}); err != nil {
			c.log.Warn("rebalance skipped", "error", err)
		}
		q.mu.Unlock()
	}
}

// errNotLeader reports a write refused because leadership moved.
var errNotLeader = errors.New("this replica is no longer the leader")

// txn applies ops only if this replica still holds the leadership key.
func (c *Coordinator) txn(ctx context.Context, t *term, ops ...clientv3.Op) error {
	for len(ops) > 0 {
		n := min(len(ops), 100) // etcd's default --max-txn-ops is 128
		t0 := c.cfg.Clock.Mono()
		var resp *clientv3.TxnResponse
		err := c.etcdCall(ctx, "write a transaction", func(ctx context.Context) (err error) {
			resp, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(t.leaderKey), "=", t.leaderRev)).Then(ops[:n]...).Commit()
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

// flush writes lowered high-water marks and deletes ledger entries of
// leases that are over: one batched transaction per quota, made while
// holding the quota's lock so that no grant raises a mark in between.
func (c *Coordinator) flush(ctx context.Context, t *term) error {
	t.mu.RLock()
	quotas := make(map[string]*quota, len(t.quotas))
	for k, v := range t.quotas {
		quotas[k] = v
	}
	retired := make(map[string]*quota, len(t.retired))
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
func (c *Coordinator) forgetRetired(t *term, retired map[string]*quota) {
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

func (c *Coordinator) flushQuota(ctx context.Context, t *term, name string, q *quota) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := q.book.Flush(c.cfg.Clock.Now())
	if d.Empty() {
		return nil
	}
	return c.writeLedger(ctx, t, write{name, q.book, d})
}

// write is one quota's ledger change (lease.LedgerDelta), with the book to
// tell once it is written.
type write struct {
	quota string
	book  *lease.Book
	delta lease.LedgerDelta
}

// writeLedger turns ws into etcd operations, writes them in one
// transaction (lowerings and deletions before raisings, should it have to
// be split), and tells each book what was written. The caller holds every
// quota's lock.
func (c *Coordinator) writeLedger(ctx context.Context, t *term, ws ...write) error {
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
func (c *Coordinator) markOp(t *term, quota string, m lease.LedgerMark) clientv3.Op {
	return clientv3.OpPut(c.keys.ledgerEntry(quota, m.Region),
		mustJSON(ledgerRecord{Instance: m.Instance, Nonce: m.Nonce, GrantID: m.GrantID, Amount: m.Amount, Total: m.Total, Epoch: t.epoch}))
}
