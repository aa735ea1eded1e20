package ratelimitxds

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a client's counters, exported by whoever registers them
// (the coordinator's /metrics).
type Metrics struct {
	responses *prometheus.CounterVec
	connects  prometheus.Counter
	connected prometheus.Gauge
	applied   *prometheus.GaugeVec

	mu      sync.Mutex
	version string // the version applied label set now
	conn    atomic.Bool
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_coordinator_xds_responses_total",
			Help: "RateLimitConfig responses from the xDS management server, by result: received, applied (ACKed), " +
				"rejected (NACKed: nothing stored), failed (not stored for now, e.g. etcd unreachable: the stream is " +
				"reopened)."}, []string{"result"}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotalease_coordinator_xds_streams_total",
			Help: "xDS streams opened (or tried) to the management server."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotalease_coordinator_xds_connected",
			Help: "1 while this replica holds an xDS stream to the management server that has delivered a response " +
				"(the leader only)."}),
		applied: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "quotalease_coordinator_xds_applied_version",
			Help: "1 for the version_info of the last xDS response this replica applied."}, []string{"version"}),
	}
}

func (m *Metrics) setApplied(version string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if version == m.version && m.version != "" {
		return
	}
	m.applied.Reset()
	m.applied.WithLabelValues(version).Set(1)
	m.version = version
}

// AppliedVersion is the version_info last applied ("" before any).
func (m *Metrics) AppliedVersion() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version
}

// Connected reports whether a stream is open.
func (m *Metrics) Connected() bool { return m.conn.Load() }

func (m *Metrics) setConnected(on bool) {
	m.conn.Store(on)
	if on {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.responses.Describe(ch)
	m.connects.Describe(ch)
	m.connected.Describe(ch)
	m.applied.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.responses.Collect(ch)
	m.connects.Collect(ch)
	m.connected.Collect(ch)
	m.applied.Collect(ch)
}
