// Package agent is the regional agent: the per-region daemon services call
// to ask "may this request go?". It holds leases on the shares of the
// global policies (leaser), enforces the leased share in the region's Redis
// with the regional engine, falls back to a bounded in-process bucket when
// Redis is slow or down (behind a circuit breaker), and serves the same
// decision over its own gRPC API, Envoy's rate-limit service and HTTP
// (package checkapi, which translates them into its admission pipeline),
// and token buckets to Envoy instances over Envoy's Rate Limit Quota
// Service (package rlqs, the edge engine). What the region's agents share in its
// Redis is package regional's (regional.Region).
package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// Config configures an Agent.
type Config struct {
	// Region this agent enforces for, and Instance, its name there.
	Region, Instance string
	// Redis is the region's Redis. Give it ContextTimeoutEnabled: true and
	// MaxRetries: -1, so CheckTimeout bounds a slow Redis and a timed-out
	// decision is not silently run twice.
	Redis redis.UniversalClient
	// Coordinator hands out leases.
	Coordinator LeaseClient
	// Policies loads the policy set; it is called at start and every
	// PolicyRefresh.
	Policies      func(ctx context.Context) ([]*policy.Policy, error)
	PolicyRefresh time.Duration
	// KeepPolicies saves every policy set Policies returns in the region's
	// Redis, and starts from the saved set when Policies fails at start.
	// Set it when Policies reads the coordinator (the usual source), so
	// that an agent can start, and a region scale out, while the
	// coordinator is unreachable. Grants are saved and restored either way.
	KeepPolicies bool
	// SavedClockSkew is the most the wall clocks of a region's agent hosts
	// may disagree: a grant restored from the region's Redis is trusted
	// that much less long. Default 1s.
	SavedClockSkew time.Duration
	// CheckTimeout bounds one decision against Redis; past it the check is
	// decided by the local fallback. Default 20ms.
	CheckTimeout time.Duration
	// RedisPipelines is how many pipelines of concurrent checks may be in
	// flight to Redis at once; each carries every check that queued while
	// the others were in flight (regional.Config.Pipelines). 0 sends every
	// check on its own. Default 2.
	RedisPipelines int
	// Drift bounds this host's clock rate error, and Margin is taken off
	// every grant's validity on top of it: the local clock bound. How long
	// a grant holds, when to renew it and how long its degraded budget is
	// reserved come with each grant. A coordinator that assumes a larger
	// drift (it says so in every answer) wins: the agent then uses that.
	Drift  float64
	Margin time.Duration
	// RenewTick is the least time between two looks at the leases for
	// renewal (jittered by up to half): the agent looks when the next
	// renewal falls due, and at least once a second. Default 100ms.
	RenewTick time.Duration
	// FallbackKeys bounds the local fallback's table, and the replay cache
	// of idempotency keys. Default 100,000.
	FallbackKeys int
	// BreakerThreshold failures in a row open the breaker for
	// BreakerCooldown. Defaults 3 and 1s.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	// RedisProbeInterval is how soon after the breaker opens the agent
	// pings Redis itself to close it, without waiting for a check (an idle
	// or unready agent gets none); each failed ping doubles the wait, up to
	// RedisProbeMaxInterval. While the breaker is closed nothing is pinged
	// (the prober waits for it to open). Defaults 250ms and 2s.
	RedisProbeInterval, RedisProbeMaxInterval time.Duration
	// IdempotencyWindow for the engine and the agent's own replay cache.
	// Default 10s.
	IdempotencyWindow time.Duration
	// HotKeys is K of the top-K hottest identities per policy. Default 10.
	HotKeys int
	// Answers are what the check APIs' answers carry beyond the decision
	// (Envoy's headers and metadata, the HTTP API's RateLimit fields).
	checkapi.Answers
	// Edge configures the Rate Limit Quota Service Envoy instances stream
	// to on the gRPC port (docs/rlqs.md).
	Edge rlqs.Config
	// Shadow puts every policy in shadow mode (policy.Policy.ShadowMode):
	// decide and count as usual, admit everything.
	Shadow bool
	// MetricIdentities is how the hot-identity metric names identities
	// (tenant names, IPs): IdentitiesHashed by default, IdentitiesPlain to
	// opt in to the names, IdentitiesOff to export none.
	MetricIdentities string
	// OnReadiness, when set, is told what Readiness answers each time it
	// answers otherwise than before (ready, or its reason). The presence
	// round asks at its end, once a second, so a change is told within a
	// second, or two when the round waited its full second on a slow
	// Redis. The gRPC health status follows it. It is called from that one
	// goroutine and must not block.
	OnReadiness func(ready bool, why string)
	// Clock is the time source, clock.System() by default. The agent
	// measures every deadline as a difference of Clock.Now() readings, so
	// they must carry Go's monotonic reading (time.Now's do); wall time is
	// used only for what leaves the process (the saved grants, metrics).
	Clock  clock.Clock
	Logger hclog.Logger
}

// DefaultConfig returns a Config with every setting at its default: start
// from it and set Region, Instance, Redis, Coordinator and Policies. As in
// hashicorp/raft, a zero is a value, never a request for the default.
func DefaultConfig() Config {
	return Config{
		CheckTimeout:          20 * time.Millisecond,
		RedisPipelines:        2,
		Drift:                 lease.DefaultTiming.Drift,
		Margin:                lease.DefaultTiming.Margin,
		SavedClockSkew:        time.Second,
		RenewTick:             100 * time.Millisecond,
		PolicyRefresh:         10 * time.Second,
		FallbackKeys:          100_000,
		BreakerThreshold:      3,
		BreakerCooldown:       time.Second,
		RedisProbeInterval:    250 * time.Millisecond,
		RedisProbeMaxInterval: 2 * time.Second,
		IdempotencyWindow:     regional.DefaultIdempotencyWindow,
		MetricIdentities:      IdentitiesHashed,
		Answers:               checkapi.DefaultAnswers(),
		HotKeys:               10,
		Edge:                  rlqs.DefaultConfig(),
		Clock:                 clock.System(),
		Logger:                hclog.New(&hclog.LoggerOptions{Name: "agent"}),
	}
}

// ValidateConfig reports every setting of c that cannot work, joined.
func ValidateConfig(c Config) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !policy.RegionNameRE.MatchString(c.Region) {
		bad("region %q must be 1-63 characters of a-z, 0-9 and '-'", c.Region)
	}
	if c.Instance == "" {
		bad("instance name is empty")
	}
	if c.Redis == nil || c.Coordinator == nil || c.Policies == nil {
		bad("Redis, Coordinator and Policies are required")
	}
	if c.Clock == nil || c.Logger == nil {
		bad("clock and logger must be set (start from DefaultConfig)")
	}
	if err := (lease.Timing{ValidFor: time.Hour, Drift: c.Drift, Margin: c.Margin}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.CheckTimeout <= 0 || c.RenewTick <= 0 || c.PolicyRefresh <= 0 ||
		c.BreakerCooldown <= 0 || c.IdempotencyWindow <= 0 {
		bad("check timeout %s, renew tick %s, policy refresh %s, breaker cooldown %s and idempotency window %s "+
			"must be positive",
			c.CheckTimeout, c.RenewTick, c.PolicyRefresh, c.BreakerCooldown, c.IdempotencyWindow)
	}
	if c.RedisProbeInterval <= 0 || c.RedisProbeMaxInterval < c.RedisProbeInterval {
		bad("redis probe interval %s must be positive and at most the max %s", c.RedisProbeInterval, c.RedisProbeMaxInterval)
	}
	if c.RedisPipelines < 0 {
		bad("redis pipelines %d is negative", c.RedisPipelines)
	}
	if c.SavedClockSkew < 0 {
		bad("saved clock skew %s is negative", c.SavedClockSkew)
	}
	if c.FallbackKeys < 1 || c.BreakerThreshold < 1 || c.HotKeys < 1 {
		bad("fallback keys %d, breaker threshold %d and hot keys %d must be at least 1",
			c.FallbackKeys, c.BreakerThreshold, c.HotKeys)
	}
	if err := c.Edge.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MetricIdentities != IdentitiesHashed &&
		c.MetricIdentities != IdentitiesPlain &&
		c.MetricIdentities != IdentitiesOff {
		bad("metric identities %q: use hashed, plain or off", c.MetricIdentities)
	}
	if err := c.Answers.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// httpLogInterval paces the HTTP listener's and server's log lines.
const httpLogInterval = 10 * time.Second

// Agent decides checks for one region. It is safe for concurrent use.
type Agent struct {
	cfg      Config
	engine   *regional.Engine // the admission pipeline's store
	admit    *admission.Pipeline
	policies admission.PolicySet
	leaser   *leaser
	shared   *regional.Region // what the region's agents keep in its Redis beside the counters
	m        *metrics

	hot *hotIdentities // every policy's heaviest identities (metrics)

	loaded   atomic.Bool  // a policy set is installed
	health   *redisHealth // how the agent's own round trips to Redis went
	savedFP  uint64       // the policy set last saved to Redis (Run's goroutines, one at a time)
	prune    atomic.Bool  // the policy set changed: drop saved grants of deleted policies
	inflight atomic.Int64 // checks being decided (a counter: checks may start while Drain waits)
	closing  atomic.Bool
	refresh  chan struct{} // a check named an unknown policy: reload soon
	renew    chan struct{} // policies were installed: look at the leases now
	envoy    atomic.Pointer[checkapi.EnvoyIndex]
	edge     *rlqs.Engine     // Envoy's RLQS: leases to the edge
	api      *checkapi.Server // the check APIs
}

// New returns an agent; Run starts its background work.
func New(cfg Config) (*Agent, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	m := newMetrics()
	ecfg := regional.DefaultConfig()
	ecfg.IdempotencyWindow, ecfg.Pipelines = cfg.IdempotencyWindow, cfg.RedisPipelines
	eng, err := regional.NewEngine(cfg.Redis, nil, ecfg)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:     cfg,
		engine:  eng,
		m:       m,
		hot:     newHotIdentities(cfg.HotKeys),
		refresh: make(chan struct{}, 1),
		renew:   make(chan struct{}, 1),
		health:  newRedisHealth(cfg.Logger, cfg.Clock.Now),
	}
	a.shared = regional.NewRegion(cfg.Redis, cfg.Region)
	timing := lease.Timing{Drift: cfg.Drift, Margin: cfg.Margin}
	a.leaser = newLeaser(a.shared, cfg.Instance, cfg.Coordinator, timing, cfg.Clock.Now, cfg.Logger, m, a.refreshSoon)
	asked := agentPolicies{set: &a.policies, refresh: a.refreshSoon}
	host := rlqs.Host{Clock: cfg.Clock, Logger: cfg.Logger, Shared: a.shared, Leases: a.leaser,
		Policies: &a.policies, Asked: asked, Envoy: a.envoyIndex}
	a.edge = rlqs.New(host, cfg.Edge, cfg.Drift, m.reg)
	acfg := admission.DefaultConfig()
	obs := observer{
		m:            m,
		leaser:       a.leaser,
		edge:         a.edge,
		hot:          a.hot,
		clock:        cfg.Clock,
		log:          cfg.Logger,
		fallbackKeys: cfg.FallbackKeys,
	}
	acfg.Policies = asked
	acfg.Store = timedStore{eng, m}
	acfg.Shares = edgeShares{a.leaser, a.edge}
	acfg.Observer = obs
	acfg.Clock = cfg.Clock
	acfg.StoreTimeout = cfg.CheckTimeout
	acfg.FallbackKeys, acfg.OverLimitKeys, acfg.ReplayKeys = cfg.FallbackKeys, cfg.FallbackKeys, cfg.FallbackKeys
	acfg.BreakerThreshold, acfg.BreakerCooldown = cfg.BreakerThreshold, cfg.BreakerCooldown
	acfg.ReplayWindow, acfg.Shadow = cfg.IdempotencyWindow, cfg.Shadow
	if a.admit, err = admission.New(acfg); err != nil {
		return nil, err
	}
	a.api = checkapi.New(checkapi.Config{Checker: a, Answers: cfg.Answers, Envoy: a.envoyIndex, Ready: a.Readiness,
		Metrics: promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}), HandshakeFailures: m.handshakeFails,
		Log: logs.NewPaced(cfg.Logger.Named("http"), httpLogInterval, cfg.Clock.Mono)})
	m.reg.MustRegister(hotCollector{a.hot, cfg.MetricIdentities})
	return a, nil
}

// Ready reports whether the agent can decide well (Readiness).
func (a *Agent) Ready() bool {
	ok, _ := a.Readiness()
	return ok
}

// Readiness reports whether the agent can decide well, and if not, why:
// it has a policy set, its Redis answered its last own round trip (the
// presence round once a second, or the breaker's probe) and the breaker in
// front of it is closed, every global policy is leased or in a defined
// degraded budget (a first lease round answered or failed, or a grant
// restored), and it is not shutting down. The reason names what is wrong
// as far as the agent knows it: Redis unreachable, too slow, or refusing
// its credentials; the breaker still open although Redis answered. Liveness
// is separate: a live agent that is not ready still decides every check.
func (a *Agent) Readiness() (bool, string) {
	redisErr := a.health.last()
	switch {
	case a.closing.Load():
		return false, "shutting down"
	case !a.loaded.Load() && redisErr != nil:
		return false, "no policies yet: the coordinator has not answered and the region's saved set cannot be " +
			"read: " + redisProblem(redisErr)
	case !a.loaded.Load():
		return false, "no policies yet: the coordinator has not answered and the region's Redis holds no saved set"
	case redisErr != nil:
		return false, redisProblem(redisErr) + ": checks are decided by the local fallback"
	case a.admit.BreakerOpen():
		return false, fmt.Sprintf("the breaker in front of Redis is open (checks to Redis failed or took over "+
			"the check timeout, %s): "+
			"checks are decided by the local fallback until a probe of Redis succeeds", a.cfg.CheckTimeout)
	}
	if u := a.leaser.unleased(a.cfg.Clock.Now()); len(u) > 0 {
		return false, fmt.Sprintf("%d global policies not leased yet (first lease round not finished): %s",
			len(u), strings.Join(u[:min(len(u), 5)], ", "))
	}
	return true, "ready"
}

// refreshSoon asks the refresh loop to reload the policies now (at most
// once a second, however many ask).
func (a *Agent) refreshSoon() {
	select {
	case a.refresh <- struct{}{}:
	default:
	}
}

// installPolicies validates ps and puts it in force.
func (a *Agent) installPolicies(ps []*policy.Policy) error {
	if err := a.policies.Set(ps); err != nil {
		return err
	}
	ix := checkapi.BuildEnvoyIndex(ps)
	a.envoy.Store(&ix)
	a.leaser.setPolicies(ps)
	a.edge.SetPolicies(ps)
	select { // a new policy wants its lease now, not at the next look
	case a.renew <- struct{}{}:
	default:
	}
	for _, p := range ps {
		a.m.zeroPolicy(p.Name)
	}
	a.loaded.Store(true)
	return nil
}

// probe is the agent's redisProbe, with the intervals of its
// configuration (Config.RedisProbeInterval, RedisProbeMaxInterval).
func (a *Agent) probe() redisProbe {
	return redisProbe{admit: a.admit, ping: a.pingRedis, health: a.health, open: a.m.breakerOpen, log: a.cfg.Logger,
		every: a.cfg.RedisProbeInterval, most: a.cfg.RedisProbeMaxInterval}
}

// pingRedis is one round trip to the region's Redis.
func (a *Agent) pingRedis(ctx context.Context) error { return a.cfg.Redis.Ping(ctx).Err() }

// Check decides one request through the admission pipeline.
func (a *Agent) Check(ctx context.Context, r admission.Request) (admission.Outcome, error) {
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	return a.admit.Check(ctx, r)
}

// CheckBatch decides many requests, those Redis decides in one round trip.
// Results are in order; a refused one has Err set.
func (a *Agent) CheckBatch(ctx context.Context, rs []admission.Request) []admission.Result {
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	return a.admit.CheckBatch(ctx, rs)
}
