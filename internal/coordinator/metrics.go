package coordinator

import (
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quota-lease/quota-lease/internal/version"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

var (
	descLeader = prometheus.NewDesc("quotalease_coordinator_leader", "1 while this replica leads and grants.", nil, nil)
	descEpoch  = prometheus.NewDesc("quotalease_coordinator_epoch",
		"Leader epoch of this replica (0 when following).", nil, nil)
	descGrants = prometheus.NewDesc("quotalease_coordinator_lease_answers_total",
		"Lease requests answered by this replica.", nil, nil)
	descWrites = prometheus.NewDesc("quotalease_coordinator_ledger_writes_total",
		"Ledger transactions written to etcd by this replica.", nil, nil)
	descBooked = prometheus.NewDesc("quotalease_coordinator_booked_ratio",
		"What all regions may be enforcing now for the identity booked most, as a fraction of the quota (at "+
			"most 1, except fail-open).", []string{"quota"}, nil)
	descRefused = prometheus.NewDesc("quotalease_coordinator_auth_refusals_total",
		"Calls refused for their caller's identity, by method and reason.", []string{"method", "reason"}, nil)
	descEnforced = prometheus.NewDesc("quotalease_coordinator_region_enforcing_ratio",
		"What a region may be enforcing now, as a fraction of the quota.", []string{"quota", "region"}, nil)
	descIDShares = prometheus.NewDesc("quotalease_coordinator_identity_shares",
		"Identities of a quota holding shares of their own.", []string{"quota"}, nil)
	descIDUnfit = prometheus.NewDesc("quotalease_coordinator_identity_shares_unfit",
		"Identities that asked for shares of their own in the last planning round and did not fit under the "+
			"most a quota may have.", []string{"quota"}, nil)
	descIDHeld = prometheus.NewDesc("quotalease_coordinator_identity_demands_held",
		"Identity demands the agents' reports hold now, over every instance.", []string{"quota"}, nil)
	descIDIgnore = prometheus.NewDesc("quotalease_coordinator_identity_demands_ignored_total",
		"Identity demands not taken since this replica began leading: new identities beyond what an agent "+
			"instance (2 x identity_shares + 2,000) or its region (4 such instances) may report.", []string{"quota"}, nil)
)

// collector reads the coordinator's state at scrape time.
type collector struct{ c *Coordinator }

func (k collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descLeader, descEpoch, descGrants, descWrites, descBooked, descEnforced,
		descRefused, descIDShares, descIDUnfit, descIDHeld, descIDIgnore,
	} {
		ch <- d
	}
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	c := k.c
	t := c.currentTerm()
	leader := 0.0
	if t != nil {
		leader = 1
	}
	grants, writes := c.Stats()
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(c.Epoch()))
	ch <- prometheus.MustNewConstMetric(descGrants, prometheus.CounterValue, float64(grants))
	ch <- prometheus.MustNewConstMetric(descWrites, prometheus.CounterValue, float64(writes))
	c.refused.m.Range(func(k, v any) bool {
		method, reason, _ := strings.Cut(k.(string), "\x00")
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue,
			float64(v.(*atomic.Int64).Load()), method, reason)
		return true
	})
	if t == nil {
		return
	}
	t.mu.RLock()
	quotas := make(map[string]*quotaState, len(t.quotas))
	for n, q := range t.quotas {
		quotas[n] = q
	}
	t.mu.RUnlock()
	now := c.cfg.Clock.Now()
	for name, q := range quotas {
		q.mu.Lock()
		total := float64(max(1, q.book.Total()))
		ch <- prometheus.MustNewConstMetric(descBooked, prometheus.GaugeValue, float64(q.book.MostBooked(now))/total, name)
		ch <- prometheus.MustNewConstMetric(descIDShares, prometheus.GaugeValue, float64(q.ids.Len()), name)
		ch <- prometheus.MustNewConstMetric(descIDUnfit, prometheus.GaugeValue, float64(q.ids.Unfit), name)
		ch <- prometheus.MustNewConstMetric(descIDHeld, prometheus.GaugeValue, float64(q.ids.Held()), name)
		ch <- prometheus.MustNewConstMetric(descIDIgnore, prometheus.CounterValue, float64(q.ids.Ignored), name)
		for _, s := range q.book.Statuses(now) {
			ch <- prometheus.MustNewConstMetric(descEnforced, prometheus.GaugeValue, float64(s.Enforcing)/total, name, s.Region)
		}
		q.mu.Unlock()
	}
}

// HTTPHandler serves /metrics (Prometheus), /healthz (the process runs)
// and /readyz (200 on the leader; 503 on a follower, which is healthy but
// does not grant, and 503 naming etcd and what to do while this replica's
// last etcd call failed), open to scrapers and probes. console, if not nil, is
// served at every other path under the admin read API's authorization
// (AuthorizeHTTP with ListLeases): the web console.
func (c *Coordinator) HTTPHandler(console http.Handler) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{c}, c.etcdWrite, version.Collector("coordinator"),
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	if c.cfg.RateLimitXDS != nil {
		reg.MustRegister(c.xdsMetrics)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if problem := c.etcd.problem(); problem != nil {
			http.Error(w, "not ready: "+problem.Error(), http.StatusServiceUnavailable)
			return
		}
		if !c.IsLeader() {
			http.Error(w, "following: lease calls go to the leader", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("leading\n"))
	})
	if console != nil {
		mux.Handle("/", c.AuthorizeHTTP(pb.AdminService_ListLeases_FullMethodName, console))
	}
	return mux
}
