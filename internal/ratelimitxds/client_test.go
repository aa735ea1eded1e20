package ratelimitxds_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
)

// recorder is an Applier that keeps what it was given and fails as told.
type recorder struct {
	mu      sync.Mutex
	applied []ratelimitxds.Config
	fail    error
}

func (r *recorder) apply(_ context.Context, c ratelimitxds.Config) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.applied = append(r.applied, c)
	return nil
}

func (r *recorder) last() (ratelimitxds.Config, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) == 0 {
		return ratelimitxds.Config{}, 0
	}
	return r.applied[len(r.applied)-1], len(r.applied)
}

func (r *recorder) setFail(err error) {
	r.mu.Lock()
	r.fail = err
	r.mu.Unlock()
}

func perMinute(domain string, n uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: n}}}}
}

func startClient(t *testing.T, addr string, r *recorder) *ratelimitxds.Metrics {
	t.Helper()
	m := ratelimitxds.NewMetrics()
	cl, err := ratelimitxds.NewClient(*xdsserver.Settings(addr, nil), r.apply, hclog.NewNullLogger(), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

// The client applies a response and ACKs it; refuses (NACKs) one that
// does not convert or that the applier rejects, with the reason, applying
// nothing of it; and on any other failure to apply, reconnects and is
// sent the whole state again.
func TestClientAckNack(t *testing.T) {
	srv := xdsserver.Start(t, "", "envoy-ratelimit", nil)
	r := &recorder{}
	m := startClient(t, srv.Addr, r)
	srv.Set(t, "1", perMinute("a", 10))
	testenv.WaitFor(t, 10*time.Second, "version 1 ACKed", func() bool { return srv.Acked("1") })
	if c, n := r.last(); n != 1 || c.Version != "1" || len(c.Policies) != 1 || c.Policies[0].Limit != 10 {
		t.Fatalf("applied %d: %+v", n, c)
	}

	bad := perMinute("b", 10)
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	srv.Set(t, "2", perMinute("a", 20), bad)
	testenv.WaitFor(t, 10*time.Second, "version 2 NACKed", func() bool { _, ok := srv.Nacked("2"); return ok })
	if detail, _ := srv.Nacked("2"); !strings.Contains(detail, `resource "b"`) || !strings.Contains(detail, "unit") {
		t.Fatalf("NACK detail %q does not say which resource and why", detail)
	}
	if _, n := r.last(); n != 1 {
		t.Fatalf("a refused response was applied (%d applications)", n)
	}

	r.setFail(ratelimitxds.Reject(errors.New("policy \"a\" was set by hand")))
	srv.Set(t, "3", perMinute("a", 30))
	testenv.WaitFor(t, 10*time.Second, "version 3 NACKed", func() bool { _, ok := srv.Nacked("3"); return ok })
	if detail, _ := srv.Nacked("3"); !strings.Contains(detail, "set by hand") {
		t.Fatalf("NACK detail %q", detail)
	}

	streams := srv.Streams()
	r.setFail(errors.New("etcd unreachable"))
	srv.Set(t, "4", perMinute("a", 40))
	testenv.WaitFor(t, 10*time.Second, "a new stream after a failure to store", func() bool { return srv.Streams() > streams })
	r.setFail(nil)
	testenv.WaitFor(t, 10*time.Second, "version 4 applied on a new stream", func() bool { return srv.Acked("4") })
	if c, _ := r.last(); c.Version != "4" || c.Policies[0].Limit != 40 {
		t.Fatalf("applied %+v", c)
	}
	if _, nacked := srv.Nacked("4"); nacked {
		t.Fatal("a passing failure to store was NACKed")
	}
	for result, atLeast := range map[string]float64{"applied": 2, "rejected": 2, "failed": 1} {
		if got := metric(t, m, "quotalease_coordinator_xds_responses_total", result); got < atLeast {
			t.Errorf("responses{result=%q} = %v, want at least %v", result, got, atLeast)
		}
	}
	if got := metric(t, m, "quotalease_coordinator_xds_applied_version", "4"); got != 1 {
		t.Errorf("applied version metric for 4 = %v", got)
	}
}

// When the management server goes away the client keeps what it applied,
// reconnects with backoff, and applies what the restarted server serves.
func TestClientSurvivesServerRestart(t *testing.T) {
	srv := xdsserver.Start(t, "", "envoy-ratelimit", nil)
	r := &recorder{}
	m := startClient(t, srv.Addr, r)
	srv.Set(t, "1", perMinute("a", 10))
	testenv.WaitFor(t, 10*time.Second, "version 1 ACKed", func() bool { return srv.Acked("1") })
	srv.Stop()
	testenv.WaitFor(t, 10*time.Second, "the client sees the stream end", func() bool { return !m.Connected() })
	before := metric(t, m, "quotalease_coordinator_xds_streams_total", "")
	testenv.WaitFor(t, 10*time.Second, "reconnection attempts while the server is down", func() bool {
		return metric(t, m, "quotalease_coordinator_xds_streams_total", "") >= before+2
	})
	if _, n := r.last(); n != 1 {
		t.Fatalf("%d applications while the server was down", n)
	}
	again := xdsserver.Start(t, srv.Addr, "envoy-ratelimit", nil)
	again.Set(t, "1", perMinute("a", 15)) // a restarted server may reuse a version string
	testenv.WaitFor(t, 10*time.Second, "the restarted server's state applied", func() bool { c, _ := r.last(); return c.Policies[0].Limit == 15 })
}

// metric sums m's series named name whose result or version label is
// value (all of them for "").
func metric(t *testing.T, m *ratelimitxds.Metrics, name, value string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	label := "result"
	if strings.HasSuffix(name, "_version") {
		label = "version"
	}
	if value == "" {
		label = ""
	}
	return testenv.MetricSum(t, reg, name, label, value)
}
