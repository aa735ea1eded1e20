package quotalease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	"github.com/quota-lease/quota-lease/edge/envoy"
)

// Client decides requests in-process on the token buckets its region's
// agents assign, and reports their usage on one RLQS stream. It is safe
// for concurrent use.
type Client struct {
	cfg    Config
	agents []agentConn // one connection per agent (one for a Target), tried in turn

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	outbox  chan *rlqsv3.RateLimitQuotaUsageReports // first reports, to the main loop
	tickNow chan struct{}
	reset   chan struct{}

	mu      sync.Mutex
	buckets map[string]*bucket
	stats   Stats
	// firstAssign: for each bucket's first assignment, the time since the
	// last report that carried the bucket was built.
	firstAssign []time.Duration
}

// maxFirstAssign bounds what FirstAssignments keeps.
const maxFirstAssign = 1024

// New starts a client. It opens its stream with its first bucket, as Envoy
// does, and runs until ctx ends or Close.
func New(ctx context.Context, cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("quotalease: %w", err)
	}
	c := &Client{
		cfg:     cfg,
		outbox:  make(chan *rlqsv3.RateLimitQuotaUsageReports, cfg.SendQueue),
		tickNow: make(chan struct{}, 1),
		reset:   make(chan struct{}, 1),
		buckets: map[string]*bucket{},
	}
	c.cfg.Buckets = cfg.Buckets.Clone()
	targets := cfg.Agents
	if cfg.Target != "" {
		targets = []string{cfg.Target}
	}
	// Pings find an agent gone without closing its connection (a
	// partition, a paused host) within Keepalive and its timeout, and a
	// connection attempt to one gives up after ConnectTimeout, so the
	// stream moves to the next agent; the agents admit a ping every 2 s.
	// The same options in cfg.DialOptions override these.
	opts := append([]grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: Keepalive, Timeout: Keepalive / 2}),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: ConnectTimeout}),
	}, cfg.DialOptions...)
	for _, t := range targets {
		conn, err := grpc.NewClient(t, opts...)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("quotalease: agent %s: %w", t, err)
		}
		c.agents = append(c.agents, agentConn{target: t, conn: conn, rlqs: rlqsv3.NewRateLimitQuotaServiceClient(conn)})
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.wg.Add(1)
	go c.run()
	return c, nil
}

// Close stops the client: its stream, its goroutines, its connection.
// Decisions after Close keep following the buckets' cached assignments
// until they expire.
func (c *Client) Close() error {
	c.cancel()
	c.wg.Wait()
	return c.closeConns()
}

// agentConn is the connection to one agent. Each is its own, rather than
// one balanced over all, so that an agent that refuses the stream (at its
// most streams, draining) is left for the next, as its answer asks.
type agentConn struct {
	target string
	conn   *grpc.ClientConn
	rlqs   rlqsv3.RateLimitQuotaServiceClient
}

func (c *Client) closeConns() error {
	var errs []error
	for _, a := range c.agents {
		errs = append(errs, a.conn.Close())
	}
	return errors.Join(errs...)
}

// Allow decides one request of the bucket (a BucketId, as the agent's
// policies match it: for example {"policy": "api-per-tenant", "tenant":
// "acme"}). It never waits on the network.
func (c *Client) Allow(bucket map[string]string) bool {
	allowed, _, _ := c.decide(bucket, 1, false)
	return allowed
}

// AllowN decides a request that costs n units of the bucket, and says
// what the bucket holds after it. A request of a bucket the client has
// not seen is decided by the no-assignment behaviour and reported at
// once, so that the agent assigns the bucket within a round trip.
func (c *Client) AllowN(bucket map[string]string, n uint64) Decision {
	allowed, st, now := c.decide(bucket, n, true)
	return decisionOf(allowed, n, st, now, c.cfg.ReportInterval)
}

// decide decides a request of n units of bucket at the clock's now and,
// with state, returns what the bucket holds after it.
func (c *Client) decide(
	bucket map[string]string,
	n uint64,
	state bool,
) (allowed bool, st envoy.State, now time.Duration) {
	now = c.cfg.Clock.Mono()
	var buf [128]byte
	k := appendKey(buf[:0], bucket)
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buckets[string(k)] // no allocation: the compiler reads k in place
	if b == nil {
		b = c.add(string(k), bucket, now)
	}
	return c.take(b, n, now, state)
}

// add caches a new bucket under key, at now; c.mu is held.
func (c *Client) add(key string, id map[string]string, now time.Duration) *bucket {
	b := newBucket(&rlqsv3.BucketId{Bucket: maps.Clone(id)}, &c.cfg.Buckets, now)
	c.buckets[key] = b
	return b
}

// take decides a request of n units on b at now, c.mu held. A new
// bucket's first request is decided by the no-assignment behaviour and
// reported at once, alone (Envoy's createBucketImpl).
func (c *Client) take(
	b *bucket,
	n uint64,
	now time.Duration,
	state bool,
) (allowed bool, st envoy.State, _ time.Duration) {
	if b.fresh {
		b.fresh = false
		allowed = c.cfg.Buckets.FirstAllowed()
		b.m.CountN(allowed, n)
		first := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.cfg.Domain,
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{b.take(now, !c.cfg.WholeSeconds).proto()}}
		c.stats.FirstReports++
		select {
		case c.outbox <- first:
		default:
			c.stats.Dropped++
		}
	} else {
		allowed = b.m.AllowN(now, n)
	}
	b.used = now
	if allowed {
		c.stats.Allowed += n
	} else {
		c.stats.Denied += n
	}
	if state {
		st = b.m.State(now)
	}
	return allowed, st, now
}

// ReportNow sends a report of every bucket now, once the first bucket has
// started the report timer.
func (c *Client) ReportNow() {
	select {
	case c.tickNow <- struct{}{}:
	default:
	}
}

// ResetStream ends the current stream as if the agent had closed it.
func (c *Client) ResetStream() {
	select {
	case c.reset <- struct{}{}:
	default:
	}
}

// Stats are the client's counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Buckets = len(c.buckets)
	return s
}

// State is what the client holds for bucket now, after any expiry that
// fell due; false if it holds nothing (never seen, abandoned, forgotten).
func (c *Client) State(bucket map[string]string) (envoy.State, bool) {
	now := c.cfg.Clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.buckets[Key(bucket)]
	if !ok {
		return envoy.State{}, false
	}
	return b.m.State(now), true
}

// FirstAssignments are, for the last 1,024 buckets the agent assigned
// since the client created them (again after an abandon), how long after
// the last report that carried the bucket its first assignment was
// applied: the agent's report-to-assignment latency.
func (c *Client) FirstAssignments() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.firstAssign)
}

// periodicReport is every bucket's usage since the last report, ordered
// by bucket, after forgetting the buckets unused for ForgetAfter. The
// client's lock is held only to read and reset the counts: decisions do
// not wait while the report is written out.
func (c *Client) periodicReport() *rlqsv3.RateLimitQuotaUsageReports {
	now := c.cfg.Clock.Mono()
	c.mu.Lock()
	us := make([]usage, 0, len(c.buckets))
	for k, b := range c.buckets {
		if c.cfg.ForgetAfter > 0 && now-b.used >= c.cfg.ForgetAfter {
			b.gone = true
			delete(c.buckets, k)
			c.stats.Forgotten++
			continue
		}
		b.m.Settle(now)
		u := b.take(now, !c.cfg.WholeSeconds)
		u.key = k
		us = append(us, u)
	}
	c.stats.PeriodicReports++
	c.mu.Unlock()
	slices.SortFunc(us, func(a, b usage) int { return strings.Compare(a.key, b.key) })
	msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: c.cfg.Domain,
		BucketQuotaUsages: make([]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, len(us))}
	for i, u := range us {
		msg.BucketQuotaUsages[i] = u.proto()
	}
	return msg
}

// apply applies each action of resp in order (Envoy's
// onQuotaResponseImpl).
func (c *Client) apply(resp *rlqsv3.RateLimitQuotaResponse) {
	now := c.cfg.Clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Responses++
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			c.stats.Ignored++
			continue
		}
		k := Key(a.GetBucketId().GetBucket())
		b, ok := c.buckets[k]
		if !ok { // the agent cannot create buckets; only reports subscribe
			c.stats.Ignored++
			continue
		}
		b.m.Settle(now)
		switch {
		case a.GetQuotaAssignmentAction() != nil:
			if !b.assign(a.GetQuotaAssignmentAction(), now) {
				c.stats.Ignored++
				continue
			}
			c.stats.Assignments++
			if !b.assignedOnce {
				b.assignedOnce = true
				if len(c.firstAssign) == maxFirstAssign {
					c.firstAssign = append(c.firstAssign[:0], c.firstAssign[1:]...)
				}
				c.firstAssign = append(c.firstAssign, now-b.reported)
			}
		case a.GetAbandonAction() != nil:
			b.gone = true
			delete(c.buckets, k) // its unreported usage goes with it
			c.stats.Abandoned++
		default:
			b.m.AssignNothing(now)
		}
	}
}

func (c *Client) count(f func(*Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}
