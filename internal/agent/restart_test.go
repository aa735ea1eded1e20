package agent

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// hungCoordinator answers nothing: every call waits until its context
// ends, as a stopped (SIGSTOP) coordinator or etcd does. It counts the
// calls that returned.
type hungCoordinator struct{ returned atomic.Int64 }

func (h *hungCoordinator) Lease(ctx context.Context, _ *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	<-ctx.Done()
	h.returned.Add(1)
	return nil, ctx.Err()
}

func (h *hungCoordinator) policies(ctx context.Context) ([]*policy.Policy, error) {
	<-ctx.Done()
	h.returned.Add(1)
	return nil, ctx.Err()
}

// startBare runs an agent of region us on redisAddr with cfg's
// coordinator and policies, without waiting for it to be ready.
func startBare(t *testing.T, redisAddr string, mod func(*Config)) *Agent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Region, cfg.Instance, cfg.Redis = "us", "us-2", failFastRedis(t, redisAddr, "")
	cfg.Drift, cfg.Margin, cfg.RenewTick = testTiming.Drift, testTiming.Margin, 20*time.Millisecond
	cfg.CheckTimeout, cfg.SavedClockSkew, cfg.Logger = 250*time.Millisecond, 50*time.Millisecond, hclog.NewNullLogger()
	mod(&cfg)
	a, stop := runAgent(t, cfg)
	t.Cleanup(stop)
	return a
}

// An agent that starts while the coordinator hangs serves from the
// region's saved state at once: the policies and the grant its region's
// previous agent held, then the degraded budget falling back from it. It
// never waits for the coordinator, which never answers here.
func TestStartDuringCoordinatorOutage(t *testing.T) {
	k := policyCoordinator(t, apiPolicy+"failure: {mode: static-share, static_fraction: 0.3}\n",
		"name: strict\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	redisAddr := startRedis(t).Addr
	first := startAgent(t, "us", redisAddr, []string{k.addr}, nil)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	var saved regional.SavedGrant
	testenv.WaitFor(t, 10*time.Second, "the first agent's grant saved in Redis", func() bool {
		saved = savedGrantOf(t, rdb, "api")
		g, _ := heldGrant(first.a, "api")
		return saved.ID != "" && saved.ID == g.ID
	})
	first.stop()
	k.stop()

	hung := &hungCoordinator{}
	began := time.Now()
	a := startBare(t, redisAddr, func(c *Config) {
		c.Coordinator, c.Policies, c.KeepPolicies = hung, hung.policies, true
	})
	testenv.WaitFor(t, 10*time.Second, "ready from the saved state", a.Ready)
	o, err := a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA, Cost: 1})
	served := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first check %s in mode %s after %v (restored grant %d, limits %+v)", map[bool]string{true: "admitted", false: "rejected"}[o.Allowed], o.Mode, served, saved.Amount, o.Limits)
	if hung.returned.Load() != 0 {
		t.Fatalf("the agent served only after a coordinator call gave up (%d returned): it waited on the outage", hung.returned.Load())
	}
	if !o.Allowed || o.Mode == lease.ModeNone {
		t.Fatalf("a restart during an outage decided %+v: it must enforce the saved grant or its degraded budget", o)
	}
	// What it enforces is what the coordinator counts for the region: the
	// saved grant, or the static share capped by it.
	p, _ := a.policies.Policy("api")
	total := p.Limits().Amount()
	amt, mode := a.leaser.Enforce("api", "", time.Now())
	want := saved.Amount
	if mode == lease.ModeDegraded {
		want = min(saved.Amount, total*3/10)
	}
	if amt != want {
		t.Fatalf("enforcing %d in mode %s, want %d from the saved grant %d", amt, mode, want, saved.Amount)
	}
	// The fail-closed policy falls back from its saved grant too: nothing
	// once that has ended, never more than it.
	if amt, _ := a.leaser.Enforce("strict", "", time.Now()); amt > savedGrantOf(t, rdb, "strict").Amount {
		t.Fatalf("strict enforces %d, above its saved grant", amt)
	}
	testenv.WaitFor(t, 10*time.Second, "the restored grant to end", func() bool {
		_, m := a.leaser.Enforce("api", "", time.Now())
		return m == lease.ModeDegraded
	})
	if amt, _ := a.leaser.Enforce("api", "", time.Now()); amt != min(saved.Amount, total*3/10) {
		t.Fatalf("degraded budget %d, want the static share %d capped by the saved grant %d", amt, total*3/10, saved.Amount)
	}
}

// savedGrantOf reads the grant saved for quota in region us (zero if none).
func savedGrantOf(t *testing.T, rdb *redis.Client, quota string) regional.SavedGrant {
	t.Helper()
	gs, err := regional.NewRegion(rdb, "us").LoadGrants(context.Background(), []string{quota})
	if err != nil {
		t.Fatal(err)
	}
	return gs[quota]
}

// An agent with no saved state and no coordinator follows each policy's
// failure mode, never a blanket reject: region policies as usual, fail-open
// its open fraction, and the modes whose budget is a reserved share
// nothing, since no share was ever reserved for it. It is ready: it decides
// every policy in a defined way.
func TestStartWithNoStateFollowsFailureModes(t *testing.T) {
	redisAddr := startRedis(t).Addr
	ps := testenv.MustPolicies(t, `
{name: local, identity: [tenant], limit: 10, period: 1s, scope: region}
---
{name: open, identity: [tenant], limit: 100, period: 1s, failure: {mode: fail-open, open_fraction: 0.2}}
---
{name: static, identity: [tenant], limit: 100, period: 1s, failure: {mode: static-share, static_fraction: 0.5}}
---
{name: closed, identity: [tenant], limit: 100, period: 1s}
`)
	hung := &hungCoordinator{}
	a := startBare(t, redisAddr, func(c *Config) {
		c.Coordinator = hung
		c.Policies = func(context.Context) ([]*policy.Policy, error) { return ps, nil } // --policies FILE
		c.RenewTick = 5 * time.Millisecond
	})
	testenv.WaitFor(t, 10*time.Second, "ready", a.Ready)
	want := map[string]struct {
		allowed bool
		mode    lease.Mode
	}{
		"local":  {true, lease.ModeRegion},
		"open":   {true, lease.ModeDegraded},
		"static": {false, lease.ModeDegraded},
		"closed": {false, lease.ModeDegraded},
	}
	for name, w := range want {
		o, err := a.Check(t.Context(), admission.Request{Policy: name, Attributes: tenantA, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if o.Allowed != w.allowed || o.Mode != w.mode {
			t.Errorf("%s: allowed %v in mode %s, want %v in %s", name, o.Allowed, o.Mode, w.allowed, w.mode)
		}
	}
	if amt, _ := a.leaser.Enforce("open", "", time.Now()); amt != 20*policy.Micro {
		t.Errorf("fail-open enforces %d, want its open fraction %d", amt, 20*policy.Micro)
	}
}

// Without policies from anywhere the agent stays up and says why it is
// not ready, instead of exiting.
func TestNoPoliciesNotReadyButRunning(t *testing.T) {
	hung := &hungCoordinator{}
	a := startBare(t, startRedis(t).Addr, func(c *Config) {
		c.Coordinator, c.KeepPolicies = hung, true
		c.Policies = func(context.Context) ([]*policy.Policy, error) { return nil, io.ErrUnexpectedEOF }
	})
	testenv.WaitFor(t, 10*time.Second, "a refresh attempt", func() bool { _, why := a.Readiness(); return strings.Contains(why, "no policies") })
	if a.Ready() {
		t.Fatal("ready without policies")
	}
}

// Readiness follows Redis: a cut store turns /readyz 503 within a presence
// round or two, naming Redis, and back to 200 once it answers.
func TestReadinessFollowsRedis(t *testing.T) {
	k := policyCoordinator(t, apiPolicy)
	px := startRedisBehindProxy(t)
	ra := startAgent(t, "us", px.Addr, []string{k.addr}, nil)
	readyz := func() (int, string) {
		resp, err := http.Get(ra.httpURL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("readyz %d %q before the cut", code, body)
	}
	px.Cut()
	cut := time.Now()
	testenv.WaitFor(t, 10*time.Second, "readyz 503", func() bool { c, _ := readyz(); return c == http.StatusServiceUnavailable })
	code, body := readyz()
	t.Logf("readyz %d %q %v after the cut", code, strings.TrimSpace(body), time.Since(cut))
	if !strings.Contains(body, "Redis") {
		t.Fatalf("readyz body %q does not name Redis", body)
	}
	if resp, err := http.Get(ra.httpURL + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %v %v while Redis is cut: liveness must not follow Redis", resp, err)
	}
	px.Restore()
	testenv.WaitFor(t, 10*time.Second, "readyz 200 again", func() bool { c, _ := readyz(); return c == http.StatusOK })
}
