package agent

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/lease"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// One embedded etcd serves the whole package; every test uses its own
// key prefix.
func TestMain(m *testing.M) { testenv.MainWithEtcd(m) }

// testTiming: 2 s leases so expiry happens within a test.
var testTiming = lease.Timing{ValidFor: 2 * time.Second, Drift: 1e-4, Margin: 20 * time.Millisecond, DegradedTimeout: 30 * time.Second}

// apiPolicy is the policy most tests check against: api, 100 checks a
// second per tenant, global (leased); tests append what they change.
const apiPolicy = "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n"

// coord is a coordinator replica in this process.
type coord struct {
	c      *coordinator.Coordinator
	cli    *clientv3.Client
	srv    *grpc.Server
	addr   string
	prefix string // its etcd key prefix, for a successor on the same state
	stop   func()
}

// startCoordinator starts a leading replica on addr ("" for any port);
// mods change its configuration.
func startCoordinator(t testing.TB, prefix string, addr string, mods ...func(*coordinator.Config)) *coord {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.EtcdEndpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	k := &coord{cli: cli, srv: grpc.NewServer(), addr: lis.Addr().String(), prefix: prefix}
	cfg := coordinator.DefaultConfig()
	cfg.Name, cfg.Advertise, cfg.Prefix, cfg.Regions = "c", k.addr, prefix, []string{"us", "eu", "ap"}
	cfg.Timing, cfg.SessionTTL, cfg.RebalanceInterval, cfg.FlushInterval = testTiming, 2*time.Second, 50*time.Millisecond, 200*time.Millisecond
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error})
	for _, mod := range mods {
		mod(&cfg)
	}
	k.c, err = coordinator.New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	k.c.Register(k.srv)
	go k.srv.Serve(lis)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.c.Run(ctx); close(done) }()
	var once sync.Once
	k.stop = func() { once.Do(func() { k.srv.Stop(); cli.Close(); cancel(); <-done }) } // a crash: no resign
	t.Cleanup(k.stop)
	deadline := time.Now().Add(15 * time.Second)
	for !k.c.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("coordinator did not become leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return k
}

// policyCoordinator starts a leading coordinator replica on a key prefix
// of t's own and stores each of policies in it: the start of the tests
// that keep the coordinator at hand, to stop it, store more policies or
// reach its admin API.
func policyCoordinator(t testing.TB, policies ...string) *coord {
	t.Helper()
	k := startCoordinator(t, testenv.Prefix(t), "")
	for _, p := range policies {
		setPolicy(t, k.addr, p)
	}
	return k
}

// setPolicy stores the policies of yaml through the admin API at addr.
func setPolicy(t testing.TB, addr, yaml string) {
	t.Helper()
	cl, err := leaseapi.NewClient([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	err = cl.Call(context.Background(), func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		_, err := pb.NewAdminServiceClient(cc).SetPolicy(context.Background(), &pb.SetPolicyRequest{Yaml: yaml}, opts...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runningAgent is an Agent with its gRPC and HTTP servers on loopback.
type runningAgent struct {
	a        *Agent
	grpcAddr string
	httpURL  string
	stop     func()
}

// httpConns is the test agents' HTTP connection cap.
const httpConns = 64

func startAgent(t testing.TB, region, redisAddr string, coordAddrs []string, mod func(*Config)) *runningAgent {
	t.Helper()
	cl, err := leaseapi.NewClient(coordAddrs)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolSize: 32})
	cfg := DefaultConfig()
	cfg.Region, cfg.Instance, cfg.Redis, cfg.Coordinator = region, region+"-1", rdb, cl
	cfg.Policies, cfg.KeepPolicies = PoliciesFromCoordinator(cl), true
	cfg.PolicyRefresh, cfg.Drift, cfg.Margin, cfg.RenewTick = 200*time.Millisecond, testTiming.Drift, testTiming.Margin, 20*time.Millisecond
	// Generous, so that a loaded test machine does not send checks to the
	// local fallback; tests of the fallback set their own.
	cfg.CheckTimeout = 250 * time.Millisecond
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error})
	if mod != nil {
		mod(&cfg)
	}
	a, stopRun := runAgent(t, cfg)
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	gs := grpc.NewServer(checkapi.GRPCServerOptions()...)
	a.RegisterGRPC(gs)
	go gs.Serve(gl)
	lc := checkapi.DefaultHTTPListener(nil, httpConns)
	hs, guarded, err := a.ListenHTTP(hl, a.HTTPHandler(), lc)
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(guarded)
	var once sync.Once
	ra := &runningAgent{a: a, grpcAddr: gl.Addr().String(), httpURL: "http://" + hl.Addr().String(), stop: func() {
		once.Do(func() {
			stopRun()
			gs.Stop()
			hs.Close()
			rdb.Close()
			cl.Close()
		})
	}}
	t.Cleanup(ra.stop)
	deadline := time.Now().Add(10 * time.Second)
	for !a.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("agent not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return ra
}

// runAgent makes an agent of cfg and runs it until stop, which waits for
// Run to return.
func runAgent(t testing.TB, cfg Config) (a *Agent, stop func()) {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	return a, func() { cancel(); <-done }
}

// grpcConn is a plaintext client connection to addr, closed at the end of
// t.
func grpcConn(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

// roomInWindow waits until the fixed window of period now in progress
// (windows align to the Unix epoch, on Redis's clock, this machine's) has
// at least a sixth of it left, so that the checks a test makes next, which
// expect exact counts, fall in one window.
func roomInWindow(t testing.TB, period time.Duration) {
	t.Helper()
	testenv.WaitFor(t, 2*period, "room left in the window", func() bool {
		return time.Now().UnixNano()%int64(period) < int64(period)*5/6
	})
}

// counterValue sums every series of the counter named name on a's registry.
func counterValue(t testing.TB, a *Agent, name string) float64 {
	t.Helper()
	return counterValueLabeled(t, a, name, "", "")
}

// counterValueLabeled sums a counter's series whose label has value (all
// of them for an empty label).
func counterValueLabeled(t testing.TB, a *Agent, name, label, value string) float64 {
	t.Helper()
	return testenv.MetricSum(t, a.m.reg, name, label, value)
}

// startRedisBehindProxy starts a redis-server and a fault proxy in front
// of it, both stopped at the end of t; agents are pointed at the proxy.
func startRedisBehindProxy(t testing.TB) *faultproxy.Proxy {
	t.Helper()
	srv := startRedis(t)
	proxy, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return proxy
}

// callEvery checks in on a every interval, at most n times or until stop
// is closed, and hands each outcome to seen. A failed check fails the test
// and ends the loop.
func callEvery(t testing.TB, a *Agent, in admission.Request, every time.Duration, n int, stop <-chan struct{}, seen func(admission.Outcome)) {
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return
		default:
		}
		o, err := a.Check(t.Context(), in)
		if err != nil {
			t.Errorf("check: %v", err)
			return
		}
		seen(o)
		time.Sleep(every)
	}
}

// regionAgent is the usual test set-up: a coordinator holding policy
// (YAML), a fresh Redis, and region us's agent on both, changed by mod.
func regionAgent(t testing.TB, policy string, mod func(*Config)) *runningAgent {
	t.Helper()
	_, ra := coordinatedAgent(t, policy, mod)
	return ra
}

// coordinatedAgent is regionAgent's set-up with its coordinator, for the
// tests that stop it, store more policies or read its admin API.
func coordinatedAgent(t testing.TB, policy string, mod func(*Config)) (*coord, *runningAgent) {
	t.Helper()
	k := policyCoordinator(t, policy)
	return k, startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, mod)
}

// waitLeased waits up to within for a to enforce a lease of quota, as
// tests that then take the coordinator away or change the policy need.
func waitLeased(t testing.TB, a *Agent, quota string, within time.Duration) {
	t.Helper()
	testenv.WaitFor(t, within, "a lease", func() bool {
		_, m := a.leaser.Enforce(quota, "", time.Now())
		return m == lease.ModeLeased
	})
}

// heldGrant is the grant a holds of quota and how long it is valid, read
// under the leaser's lock.
func heldGrant(a *Agent, quota string) (lease.Grant, time.Time) {
	a.leaser.mu.Lock()
	defer a.leaser.mu.Unlock()
	return a.leaser.quotas[quota].a.Grant()
}

// logTo is a logger writing the lines of level and above to w, for tests
// that read what an agent logs.
func logTo(w io.Writer, level hclog.Level) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: level, Output: w})
}

// failFastRedis is a client of the Redis at addr that gives up as soon as
// an agent's does (no retries, 200 ms to dial), closed at the end of t.
func failFastRedis(t testing.TB, addr, password string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
