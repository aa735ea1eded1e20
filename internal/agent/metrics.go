package agent

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/handshake"
	"github.com/quota-lease/quota-lease/internal/version"
	"github.com/quota-lease/quota-lease/policy"
)

// metrics are an agent's Prometheus metrics, on its own registry (no
// global state).
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	redisLatency prometheus.Histogram
	leaseShare   *prometheus.GaugeVec
	leaseState   *prometheus.GaugeVec
	// degradedSeconds counts time spent on a degraded budget, per policy.
	degradedSeconds *prometheus.CounterVec
	renewFails      *prometheus.CounterVec
	budgetAdmits    *prometheus.CounterVec
	breakerOpen     prometheus.Gauge
	// fallbackAfterTimeout counts possible double charges; replays,
	// keyed retries answered from the replay cache.
	fallbackAfterTimeout *prometheus.CounterVec
	replays              *prometheus.CounterVec
	overLimitHits        *prometheus.CounterVec
	instances            prometheus.Gauge
	storeLosses          prometheus.Counter
	storeBorn            prometheus.Gauge
	handshakeFails       *prometheus.CounterVec
	returned             *prometheus.CounterVec // returned hits (returns.go)
	// overCharged counts the units of charges after the fact counted
	// though they no longer fitted (policy.Limits.PostHoc).
	overCharged *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_decisions_total",
			Help: "Checks decided, by policy, mode (leased, degraded, local-fallback, unleased, region) and result " +
				"(allowed, rejected, or shadow: rejected by the limit and allowed by shadow mode)."},
			[]string{"policy", "mode", "result"}),
		redisLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quotalease_agent_redis_seconds",
			Help:    "Latency of decision scripts against Redis, including timeouts.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1}}),
		leaseShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quotalease_agent_lease_share",
			Help: "Share of the policy's limit this agent enforces now, in units per period."}, []string{"policy"}),
		leaseState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quotalease_agent_lease_state",
			Help: "1 for the lease's current state, 0 for the others."}, []string{"policy", "state"}),
		degradedSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_degraded_seconds_total",
			Help: "Seconds this agent enforced the policy's degraded budget (its lease lapsed), measured each " +
				"lease round; rate() of it is the fraction of time degraded."},
			[]string{"policy"}),
		renewFails: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_lease_renew_failures_total",
			Help: "Lease renewals that failed, by reason: unavailable (coordinator unreachable), rate-limited (the " +
				"coordinator refused this region's call rate), refused."}, []string{"reason"}),
		budgetAdmits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_budget_admissions_total",
			Help: "Admissions on a budget other than the lease: degraded (lease lapsed) or local-fallback (Redis down)."},
			[]string{"policy", "budget"}),
		breakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotalease_agent_redis_breaker_open",
			Help: "1 while the circuit breaker in front of Redis is open (checks use the local fallback)."}),
		fallbackAfterTimeout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotalease_agent_fallback_after_timeout_total",
			Help: "Checks decided by the local fallback after their Redis script timed out. The script may still " +
				"have run, so such a request may be charged twice (in Redis and locally); it is never admitted twice."},
			[]string{"policy"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_idempotent_replays_total",
			Help: "Retries with an idempotency key answered from this agent's replay cache, charged nothing."},
			[]string{"policy"}),
		overLimitHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_overlimit_cache_hits_total",
			Help: "Checks rejected in-process because Redis rejected the same identity, under the same limits, " +
				"less than its retry delay ago: no Redis call."}, []string{"policy"}),
		instances: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotalease_agent_region_instances",
			Help: "Live agent instances in this region, as seen through Redis (divides the fallback budget)."}),
		storeLosses: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_store_losses_total",
			Help: "Times this agent saw the region's Redis lose its state (its birth marker changed)."}),
		storeBorn: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotalease_agent_store_born_timestamp_seconds",
			Help: "When the region's Redis last lost its state, as Unix time; 0 for a store never seen to lose it."}),
		handshakeFails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotalease_agent_http_handshake_failures_total",
			Help: "HTTP connections closed before their TLS handshake completed (in plaintext, before their first " +
				"byte), by reason: timeout (not within the deadline), error (not TLS, a bad certificate, a reset), " +
				"source-limit (too many pending from its address), evicted (too many pending in all: the oldest is " +
				"closed)."},
			[]string{"reason"}),
		returned: returnedUnits(),
		overCharged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_post_hoc_over_limit_units_total",
			Help: "Units of charges after the fact (a post_hoc policy: a response's tokens) that no longer fitted " +
				"the limit and were counted all the same, putting the identity over its limit (a window) or into " +
				"debt (a token bucket): what checks let through before the limit ran out. Bounded by the policy's " +
				"post-hoc term."},
			[]string{"policy"}),
	}
	m.reg.MustRegister(version.Collector("regional-agent"),
		m.returned, m.overCharged, m.storeLosses, m.storeBorn,
		m.decisions, m.redisLatency, m.leaseShare, m.leaseState,
		m.degradedSeconds, m.renewFails, m.budgetAdmits,
		m.breakerOpen, m.instances, m.fallbackAfterTimeout,
		m.replays, m.overLimitHits, m.handshakeFails,
		prometheus.NewGoCollector(),
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	for _, reason := range []string{"unavailable", "rate-limited", "refused"} { // counters exist at zero
		m.renewFails.WithLabelValues(reason)
	}
	handshakeReasons := []string{
		handshake.ReasonTimeout, handshake.ReasonError, handshake.ReasonSourceLimit, handshake.ReasonEvicted,
	}
	for _, reason := range handshakeReasons {
		m.handshakeFails.WithLabelValues(reason)
	}
	return m
}

// zeroPolicy creates policy's counters at zero, so that rate() and
// increase() see their first increment and dashboards show 0, not "no data".
func (m *metrics) zeroPolicy(policy string) {
	for _, b := range []string{"degraded", "local-fallback"} {
		m.budgetAdmits.WithLabelValues(policy, b)
	}
	m.degradedSeconds.WithLabelValues(policy)
	m.fallbackAfterTimeout.WithLabelValues(policy)
	m.replays.WithLabelValues(policy)
	m.overLimitHits.WithLabelValues(policy)
	m.overCharged.WithLabelValues(policy)
}

var hotDesc = prometheus.NewDesc("quotalease_agent_hot_identity_cost",
	"Estimated recent cost of the heaviest identities per policy (top-K, halving every 30s), in units. The "+
		"identity label is sha256:<first 12 hex> of the identity unless the agent runs with "+
		"--metric-identities plain.",
	[]string{"policy", "identity"}, nil)

// How the hot-identity metric names identities (Config.MetricIdentities).
const (
	IdentitiesHashed = "hashed"
	IdentitiesPlain  = "plain"
	IdentitiesOff    = "off"
)

// metricIdentity is identity as the metric shows it: hashed, so that
// /metrics does not publish tenant names or addresses; an operator finds
// a tenant by hashing its identity the same way (docs/runbook.md).
func metricIdentity(mode, identity string) string {
	if mode == IdentitiesPlain {
		return identity
	}
	sum := sha256.Sum256([]byte(identity))
	return "sha256:" + hex.EncodeToString(sum[:6])
}

// hotCollector exposes the top-K identities at scrape time, named as mode
// says (Config.MetricIdentities).
type hotCollector struct {
	hot  *hotIdentities
	mode string
}

func (h hotCollector) Describe(ch chan<- *prometheus.Desc) { ch <- hotDesc }

func (h hotCollector) Collect(ch chan<- prometheus.Metric) {
	if h.mode == IdentitiesOff {
		return
	}
	for policy, t := range h.hot.policies() {
		for _, e := range t.top() {
			id := metricIdentity(h.mode, e.ID)
			ch <- prometheus.MustNewConstMetric(hotDesc, prometheus.GaugeValue, float64(e.Count), policy, id)
		}
	}
}

// returnedUnits counts returned hits by what became of them.
func returnedUnits() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_returned_units_total",
		Help: "Units returned (Envoy's is_negative_hits) to a policy that accepts returns, by policy and " +
			"result: freed (given back to the limit), " +
			"cleared (matched what the limit no longer counted: a refused request's hits, units taken in an " +
			"earlier window, or refilled), unmatched (more than the identity held), " +
			"dropped (not decided: no share, or Redis could not decide it; the units stay counted until they leave " +
			"the window or are refilled)."},
		[]string{"policy", "result"})
}

// observeReturn counts return t, decided as o.
func (m *metrics) observeReturn(t admission.Ticket, o admission.Outcome) {
	if o.Via != admission.ViaStore {
		m.returned.WithLabelValues(t.Policy.Name, "dropped").Add(float64(t.Cost))
		return
	}
	for _, c := range []struct {
		result string
		micro  int64
	}{{"freed", o.Freed}, {"cleared", o.Matched - o.Freed}, {"unmatched", t.Cost*policy.Micro - o.Matched}} {
		if c.micro > 0 {
			m.returned.WithLabelValues(t.Policy.Name, c.result).Add(policy.Units(c.micro))
		}
	}
}
