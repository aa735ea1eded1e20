package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A replica's life: New makes it (replica.go holds its state), Register
// serves its lease and admin services, and Run campaigns for leadership,
// leads its terms (keeping its etcd lease alive) and compacts etcd's
// history while it leads.

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
			return &EtcdError{
				Op:        "campaign for leadership",
				Endpoints: c.etcd.endpoints,
				Err:       errors.New("the leadership session expired"),
			}
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

// lead loads the state, restores the ledger and serves until ctx ends.
func (c *Coordinator) lead(ctx context.Context, el *concurrency.Election, ll *leaderLease) error {
	st, err := c.readState(ctx)
	if err != nil {
		return err
	}
	t := &leaderTerm{
		epoch:     el.Rev(),
		leaderKey: el.Key(),
		leaderRev: el.Rev(),
		lease:     ll,
		quotas:    map[string]*quotaState{},
		retired:   map[string]*quotaState{},
		sources:   map[string]*policySource{},
		regions:   st.regions,
		paused:    st.paused,
		now:       make(chan struct{}, 1),
		claims:    newInstanceClaims(c.cfg.Timing.ValidFor),
	}
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
	c.log.Info("leading", "epoch", t.epoch, "policies", len(t.quotas), "regions", len(t.regions),
		"restored_grants", restored)

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
			if err := c.flushLowered(ctx, t); err != nil && ctx.Err() == nil {
				c.log.Warn("ledger flush failed; will retry", "error", err)
			}
		case <-compactions:
			c.compact(ctx, &cp)
		}
	}
}

// keepAlive renews the session lease every ttl/3 (each renewal within the
// etcd timeout) and extends l after each success, until ctx ends. Its
// failures are the replica's first sign of an etcd outage, recorded and
// logged by etcdCall. etcd's own keepalive (started by the session)
// runs too; this one exists to know the send times.
func (c *Coordinator) keepAlive(ctx context.Context, id clientv3.LeaseID, l *leaderLease) {
	t := time.NewTicker(c.cfg.SessionTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := c.cfg.Clock.Mono()
		err := c.etcdCall(ctx, "renew the leadership session", func(ctx context.Context) error {
			_, err := c.cli.KeepAliveOnce(ctx, id)
			return err
		})
		if err != nil {
			continue // an etcd failure is logged, paced, by etcdCall
		}
		l.extend(sent, c.cfg.SessionTTL, c.cfg.Timing.Drift, c.cfg.Timing.Margin)
	}
}

// compact reads etcd's current revision and compacts up to the one read
// at the previous call. A revision compacted already (by another
// compactor, or etcd's own) is no failure; the others are logged and
// retried at the next tick.
func (c *Coordinator) compact(ctx context.Context, cp *compactor) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.EtcdTimeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, c.keys.clusterID(), clientv3.WithCountOnly())
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("etcd compaction: could not read etcd's revision; will retry", "error", err)
		}
		return
	}
	if cp.next > 0 {
		_, err := c.cli.Compact(ctx, cp.next)
		switch {
		case err == nil:
			c.compacted.Store(cp.next)
		case errors.Is(err, rpctypes.ErrCompacted):
		default:
			c.log.Warn("etcd compaction failed; will retry", "revision", cp.next, "error", err)
			return
		}
	}
	cp.next = resp.Header.Revision
}
