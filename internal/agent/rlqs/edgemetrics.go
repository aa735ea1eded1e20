package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the metrics of the agent's Rate Limit Quota Service, on
// the agent's registry.
type metrics struct {
	reported, limited, refused              *prometheus.CounterVec
	dropped, messages, rounds, plans, syncs prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		reported: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_edge_reported_requests_total",
			Help: "Requests Envoy instances reported for the policy's buckets, by result: allowed or denied by " +
				"Envoy."}, []string{"policy", "result"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_edge_reports_limited_total",
			Help: "What Envoy instances sent beyond their limits, dropped: rate (a stream's usage reports beyond " +
				"its pace), buckets (buckets beyond a stream's cap), streams (streams beyond the agent's), " +
				"agent-buckets (buckets beyond the agent's), identities (identities beyond the agent's)."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_edge_buckets_refused_total",
			Help: "Buckets given no assignment, by reason: invalid (a bad bucket id), unknown-policy, identity " +
				"(lacks the policy's identity attributes), no-edge (the policy has no edge settings), second-bucket " +
				"(a stream's second bucket id of one identity), instances (beyond the policy's edge instances per " +
				"region, across its agents); unlimited counts buckets a configuration does not limit (assigned " +
				"ALLOW_ALL)."}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_edge_pushes_dropped_total",
			Help: "Assignment messages dropped because a stream's outbox was full (a slow Envoy): counted as sent, " +
				"refreshed later."}),
		messages: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_edge_messages_total",
			Help: "Messages of assignments and abandons sent to Envoy instances (each carries the actions of one " +
				"round for one instance)."}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_edge_rounds_total",
			Help: "Edge rounds: every 100ms (--edge-tick) at most, every read of the region's reservations at least."}),
		plans: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_edge_identity_plans_total",
			Help: "Policy identities planned by edge rounds: only those whose reports, buckets, capacity or " +
				"neighbours changed, or whose assignments want refreshing or changing; what the edge costs the agent " +
				"follows it."}),
		syncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_agent_edge_syncs_total",
			Help: "Syncs of the edge reservations with the region's Redis: when a reservation grows, and a read " +
				"about every quarter second (--edge-grow-wait / 2)."}),
	}
	reg.MustRegister(m.reported, m.limited, m.refused, m.dropped, m.messages, m.rounds, m.plans, m.syncs)
	reasons := []string{"rate", "buckets", "streams", "agent-buckets", "caller-streams", "caller-buckets", "identities"}
	for _, r := range reasons {
		m.limited.WithLabelValues(r)
	}
	for _, r := range []string{"invalid", "unknown-policy", "identity", "no-edge", "unlimited"} {
		m.refused.WithLabelValues(r)
	}
	return m
}

// edgeGauges are the per-policy gauges of what the Envoy instances
// streaming to the agent hold, counted when scraped (count, which the
// engine gives: Engine.count) rather than by the rounds: an agent serving
// many buckets pays for walking them per scrape (at most once a second),
// and every countEvery for the renewals' summary, not every second. A
// policy's series go once the agent holds nothing of it (no bucket, no
// reservation being released).
type edgeGauges struct {
	count                                    func() *edgeCount
	streams, buckets, assignedRate, reserved *prometheus.Desc
}

func newEdgeGauges(count func() *edgeCount) *edgeGauges {
	policy := []string{"policy"}
	return &edgeGauges{count: count,
		streams: prometheus.NewDesc("quotalease_agent_edge_streams",
			"Envoy RLQS streams reporting buckets of the policy to this agent.", policy, nil),
		buckets: prometheus.NewDesc("quotalease_agent_edge_buckets",
			"Buckets of the policy Envoy instances report to this agent (one per instance and identity).", policy, nil),
		assignedRate: prometheus.NewDesc("quotalease_agent_edge_assigned_rate",
			"Requests per second the token buckets this agent assigned for the policy refill, summed over its "+
				"buckets.", policy, nil),
		reserved: prometheus.NewDesc("quotalease_agent_edge_reserved",
			"What this agent reserved in the region's Redis of the policy's capacity for Envoy instances, in units "+
				"per period, summed over identities.", policy, nil),
	}
}

func (g *edgeGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.streams
	ch <- g.buckets
	ch <- g.assignedRate
	ch <- g.reserved
}

// Collect counts the edge, unless the last count is under a second old.
func (g *edgeGauges) Collect(ch chan<- prometheus.Metric) {
	c := g.count()
	for name, pc := range c.by {
		ch <- prometheus.MustNewConstMetric(g.streams, prometheus.GaugeValue, float64(len(pc.streams)), name)
		ch <- prometheus.MustNewConstMetric(g.buckets, prometheus.GaugeValue, float64(pc.buckets), name)
		ch <- prometheus.MustNewConstMetric(g.assignedRate, prometheus.GaugeValue, pc.rate, name)
		ch <- prometheus.MustNewConstMetric(g.reserved, prometheus.GaugeValue, pc.reserve, name)
	}
}
