package coordinator

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// One embedded etcd serves the whole package; every test uses its own
// key prefix.
func TestMain(m *testing.M) { testenv.MainWithEtcd(m) }

// testTiming is short so that expiry and failover happen within a test.
var testTiming = lease.Timing{ValidFor: time.Second, Drift: 1e-4, Margin: 20 * time.Millisecond, DegradedTimeout: 4 * time.Second}

type replica struct {
	c      *Coordinator
	cli    *clientv3.Client
	srv    *grpc.Server
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func etcdClient(t testing.TB) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testenv.EtcdEndpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func startReplica(t testing.TB, prefix, name string, mod func(*Config), opts ...grpc.ServerOption) *replica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{cli: etcdClient(t), addr: lis.Addr().String(), done: make(chan struct{})}
	cfg := DefaultConfig()
	cfg.Name, cfg.Advertise, cfg.Prefix, cfg.Regions = name, r.addr, prefix, []string{"us", "eu", "ap"}
	cfg.Timing, cfg.SessionTTL, cfg.RebalanceInterval, cfg.FlushInterval = testTiming, 2*time.Second, 50*time.Millisecond, 100*time.Millisecond
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: os.Stderr})
	if mod != nil {
		mod(&cfg)
	}
	r.c, err = New(r.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = grpc.NewServer(append(opts, r.c.ServerOptions()...)...)
	r.c.Register(r.srv)
	go r.srv.Serve(lis)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.c.Run(ctx); close(r.done) }()
	t.Cleanup(r.stop)
	return r
}

// stop is a graceful shutdown: step down, resign, stop serving.
func (r *replica) stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		r.srv.Stop()
		r.cli.Close()
	})
}

// crash is a kill -9: the replica stops answering and stops renewing its
// etcd session, which then expires on its own; nothing is resigned.
func (r *replica) crash() {
	r.once.Do(func() {
		r.srv.Stop()
		r.cli.Close()
		r.cancel()
		<-r.done
	})
}

func waitLeader(t testing.TB, rs ...*replica) *replica {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range rs {
			if r.c.IsLeader() {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader elected within 15s")
	return nil
}

// startLeader starts replica name under prefix (mod as for startReplica)
// and waits until it leads: the set-up of every test of a lone replica. It
// returns the replica and clients of its admin and lease APIs.
func startLeader(t testing.TB, prefix, name string, mod func(*Config)) (
	*replica, pb.AdminServiceClient, *leaseapi.Client) {
	t.Helper()
	r := startReplica(t, prefix, name, mod)
	waitLeader(t, r)
	adm, cl := admin(t, r.addr)
	return r, adm, cl
}

// setPolicy stores the policies of yaml through adm, failing t if they
// are refused: for the tests' set-up, not for the refusals they check.
func setPolicy(t testing.TB, adm pb.AdminServiceClient, yaml string) {
	t.Helper()
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: yaml}); err != nil {
		t.Fatal(err)
	}
}

// withQuota runs f with quota name of c's current term, under the quota's
// lock, as the tests that read a leader's books do; it reports false, and
// runs nothing, when c leads no term or the term has no such quota.
func withQuota(c *Coordinator, name string, f func(q *quotaState)) bool {
	t := c.currentTerm()
	if t == nil {
		return false
	}
	t.mu.RLock()
	q := t.quotas[name]
	t.mu.RUnlock()
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	f(q)
	return true
}

func admin(t testing.TB, addrs ...string) (pb.AdminServiceClient, *leaseapi.Client) {
	cl, err := leaseapi.NewClient(addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	cc, err := cl.Conn(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	return pb.NewAdminServiceClient(cc), cl
}

// testAgent plays a regional agent's lease side for one quota.
type testAgent struct {
	mu       sync.Mutex
	region   string
	instance string
	nonce    string
	quota    string
	a        *lease.Holder
	cl       *leaseapi.Client
	demand   atomic.Int64
	renewals atomic.Int64 // grants received
}

func newTestAgent(t testing.TB, cl *leaseapi.Client, region, quota string, total int64) *testAgent {
	return &testAgent{region: region, instance: region + "-1", nonce: fmt.Sprintf("%s-%d", region, time.Now().UnixNano()),
		quota: quota, a: lease.NewHolder(testTiming, failClosed, total), cl: cl}
}

// regionAgents are test agents of quota "api" (a total of 100) in the
// regions every replica serves, us, eu and ap in that order, asking the
// demands given: the agents of most tests of how a quota is shared.
func regionAgents(t testing.TB, cl *leaseapi.Client, us, eu, ap int64) []*testAgent {
	var agents []*testAgent
	for i, region := range []string{"us", "eu", "ap"} {
		a := newTestAgent(t, cl, region, "api", 100*M)
		a.demand.Store([]int64{us, eu, ap}[i])
		agents = append(agents, a)
	}
	return agents
}

func (ta *testAgent) renew(ctx context.Context) error {
	ta.mu.Lock()
	req := ta.a.Sending(time.Now())
	ta.mu.Unlock()
	resp, err := ta.cl.Lease(ctx, &pb.LeaseRequest{Region: ta.region, Instance: ta.instance, Nonce: ta.nonce,
		Quotas: []*pb.QuotaRequest{{Quota: ta.quota, GrantId: req.GrantID, Seq: req.Seq, Demand: ta.demand.Load()}}})
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if err != nil {
		ta.a.Failed(req, err)
		return err
	}
	g, _, err := leaseapi.DecodeGrant(resp.Grants[0], policy.TokenBucket, resp.Epoch, lease.Grant{})
	if err != nil {
		ta.a.Failed(req, err)
		return err
	}
	ta.a.Granted(req, g)
	ta.renewals.Add(1)
	return nil
}

// grant is the agent's current grant and until when it is valid.
func (ta *testAgent) grant() (lease.Grant, time.Time) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return ta.a.Grant()
}

// enforcing is what the agent enforces now: the ground truth.
func (ta *testAgent) enforcing() (int64, lease.Mode) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return ta.a.Enforce("", time.Now())
}

// loop renews every interval until ctx ends.
func (ta *testAgent) loop(ctx context.Context, every time.Duration) {
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		ta.renew(rctx)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

const policy100 = `
name: api
identity: [tenant]
limit: 100
period: 1s
`
