package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// scalePolicy is the per-tenant policy of the identity-share scale
// benchmark: 10/s per tenant, up to 100,000 tenants with shares of their
// own.
const scalePolicy = `name: per-tenant
identity: [tenant]
limit: 10
period: 1s
burst: 10
identity_shares: 100000
`

// scaleRegions are the benchmark's regions; identity i lives in
// scaleRegions[i%3].
var scaleRegions = []string{"us", "eu", "ap"}

// TestIdentityShareScale is the identity-share scale benchmark
// (`make bench-identity-scale`, docs/benchmarks.md): one coordinator
// process (embedded etcd) and three regions' agents, played by this test
// with the agent's own code for what it reports and how it reads grants
// (lease.Meter, lease.IdentityDemands, lease.DemandReport,
// leaseapi.DecodeGrant). 1,000,000 identities send traffic, each in one
// region; the first 100,000 ask 12/s of their 10/s (all of it belongs in
// their region), the rest one request every few seconds. It measures what
// the coordinator costs once every hot identity holds its shares (RSS, Go
// heap, CPU per renewal round, ledger writes to etcd, bytes per renewal)
// and how long a newly homed identity takes to reach 90% of its limit.
// QUOTALEASE_SCALE=N runs it with N identities (a tenth of them hot).
func TestIdentityShareScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("QUOTALEASE_SCALE"))
	if n <= 0 {
		t.Skip("the identity-share scale benchmark: make bench-identity-scale (QUOTALEASE_SCALE=1000000)")
	}
	testenv.SkipMultiProcess(t)
	// A tenth of the identities hold shares of their own; the policy's
	// identity_shares leaves room for the few that become hot later.
	hot := n/10 - scaleNewlyHot
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	coord := startScaleCoordinator(t, ctx)
	lc := pb.NewLeaseServiceClient(dial(t, coord.addr, mtls.Files{},
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(leaseapi.MaxAnswerBytes))))
	p := testenv.MustPolicy(t, scalePolicy)
	total := p.Limits().Amount()

	regions := make([]*scaleAgent, len(scaleRegions))
	for i, name := range scaleRegions {
		regions[i] = &scaleAgent{name: name, index: i, p: p, meter: lease.NewMeter[string](lease.MeterTracks(p.IdentityShareLimit()))}
	}
	tr := scaleTraffic{n: n, hot: hot}
	// step is one round of the load loop: the traffic's demand moves on and
	// every region renews whatever grant is due.
	step := func() {
		tr.step(regions, time.Now())
		for _, r := range regions {
			if err := r.renewIfDue(ctx, lc, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	start := time.Now()
	// Phase 1: every hot identity gets 90% of its limit in its region.
	var grown time.Duration
	progress := time.Now()
	for grown == 0 {
		if time.Since(progress) > 15*time.Second {
			progress = time.Now()
			t.Logf("%s: %d of %d hot identities at 90%% in their region", time.Since(start).Round(time.Second), countHomed(regions, hot, total), hot)
		}
		if ctx.Err() != nil {
			t.Fatalf("after %s: %d of %d hot identities hold 90%% of their limit in their region", time.Since(start).Round(time.Second), countHomed(regions, hot, total), hot)
		}
		step()
		if countHomed(regions, hot, total) == hot {
			grown = time.Since(start)
		}
		time.Sleep(200 * time.Millisecond) // a load loop's pace, not a wait for a result
	}
	t.Logf("%d hot identities of %d hold 90%% of their limit in their region after %s", hot, n, grown.Round(time.Second))

	// Phase 2: steady state for a minute.
	for _, r := range regions {
		r.sent, r.recv, r.renewals, r.whole = 0, 0, 0, 0
	}
	cpu0, writes0 := processCPU(t, []int{coord.pid()}), coord.metric(t, "quotalease_coordinator_ledger_writes_total")
	steady := time.Now()
	for time.Since(steady) < time.Minute {
		step()
		time.Sleep(200 * time.Millisecond)
	}
	span := time.Since(steady)
	cpu := processCPU(t, []int{coord.pid()}) - cpu0
	writes := coord.metric(t, "quotalease_coordinator_ledger_writes_total") - writes0
	var renewals, sent, recv, whole int
	for _, r := range regions {
		renewals, sent, recv, whole = renewals+r.renewals, sent+r.sent, recv+r.recv, whole+r.whole
	}
	rounds := float64(renewals) / float64(len(regions))

	rss, hwm := procStatus(t, coord.pid(), "VmRSS"), procStatus(t, coord.pid(), "VmHWM")
	heap := coord.metric(t, "go_memstats_heap_inuse_bytes")
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	fmt.Fprintf(w, "identity-share scale: %d identities seen in 3 regions, %d with shares of their own (lease 10 s)\n", n, hot+scaleNewlyHot)
	fmt.Fprintf(w, "  all %d hot identities at 90%% of their limit after %s\n", hot, grown.Round(time.Second))
	fmt.Fprintf(w, "  coordinator RSS (embedded etcd included)          %d MiB (peak %d MiB)\n", rss/1024, hwm/1024)
	fmt.Fprintf(w, "  coordinator Go heap in use                        %.0f MiB\n", heap/(1<<20))
	fmt.Fprintf(w, "  coordinator CPU per renewal round (3 renewals)    %s (%.1f rounds in %s)\n", (cpu / time.Duration(max(1, rounds))).Round(time.Millisecond), rounds, span.Round(time.Second))
	fmt.Fprintf(w, "  ledger writes to etcd                             %.2f/s\n", writes/span.Seconds())
	fmt.Fprintf(w, "  bytes per renewal, request / answer               %d / %d (answer with whole identity maps: %d)\n", sent/max(1, renewals), recv/max(1, renewals), whole/max(1, renewals))
	w.Flush()

	// Phase 3: identities that were cold become hot in one region each.
	var took []time.Duration
	for k := 0; k < scaleNewlyHot; k++ {
		id := hot + 10*k // cold until now
		home := regions[id%3]
		tr.heat(id)
		t0 := time.Now()
		for home.amountFor(scaleName(id)) < total*9/10 {
			if time.Since(t0) > 3*time.Minute {
				t.Fatalf("%s: not at 90%% of its limit in %s after 3 minutes", scaleName(id), home.name)
			}
			step()
			time.Sleep(200 * time.Millisecond)
		}
		took = append(took, time.Since(t0))
	}
	slices.Sort(took)

	fmt.Fprintf(w, "  newly homed identity at 90%% of its limit after    median %s, max %s (%d identities)\n", took[len(took)/2].Round(100*time.Millisecond), took[len(took)-1].Round(100*time.Millisecond), len(took))
}

// scaleNewlyHot is how many identities become hot in the last phase.
const scaleNewlyHot = 6

// scaleName names identity i.
func scaleName(i int) string { return "t" + strconv.Itoa(i) }

// countHomed counts the hot identities whose home region's grant gives
// them at least 90% of total.
func countHomed(regions []*scaleAgent, hot int, total int64) int {
	c := 0
	for i := 0; i < hot; i++ {
		if regions[i%3].amountFor(scaleName(i)) >= total*9/10 {
			c++
		}
	}
	return c
}

// scaleTraffic is the benchmark's traffic: identity i lives in region
// i%3; the hot ones ask 12/s, the rest one request every 5 s.
type scaleTraffic struct {
	n, hot int
	extra  map[int]bool // identities made hot later
	last   time.Time
	cold   int // next cold identity to send
}

func (tr *scaleTraffic) heat(id int) {
	if tr.extra == nil {
		tr.extra = map[int]bool{}
	}
	tr.extra[id] = true
}

// step feeds each region's meter the traffic since the last step.
func (tr *scaleTraffic) step(regions []*scaleAgent, now time.Time) {
	if tr.last.IsZero() {
		tr.last = now
		return
	}
	dt := now.Sub(tr.last)
	tr.last = now
	ms := now.UnixMilli()
	cost := int64(12 * dt.Seconds() * float64(policy.Micro))
	for i := 0; i < tr.hot; i++ {
		regions[i%3].meter.Add(scaleName(i), cost, 0, ms)
	}
	for i := range tr.extra {
		regions[i%3].meter.Add(scaleName(i), cost, 0, ms)
	}
	// Every cold identity once per 5 s: a slice of them per step.
	cold := tr.n - tr.hot
	k := min(cold, int(float64(cold)*dt.Seconds()/5)+1)
	for j := 0; j < k; j++ {
		i := tr.hot + (tr.cold+j)%cold
		if !tr.extra[i] {
			regions[i%3].meter.Add(scaleName(i), policy.Micro, 0, ms)
		}
	}
	tr.cold = (tr.cold + k) % cold
}

// scaleAgent is one region's agent instance as the benchmark plays it:
// the agent's meter, report and grant decoding, without Redis.
type scaleAgent struct {
	name     string
	index    int
	p        *policy.Policy
	meter    *lease.Meter[string]
	report   lease.DemandReport
	grant    lease.Grant
	seq      uint64
	next     time.Time
	sent     int // request bytes
	recv     int // answer bytes
	whole    int // answer bytes had the identity shares been sent whole
	renewals int
}

func (a *scaleAgent) amountFor(id string) int64 { return a.grant.AmountFor(id) }

// renewIfDue renews the region's lease when its grant asks.
func (a *scaleAgent) renewIfDue(ctx context.Context, lc pb.LeaseServiceClient, now time.Time) error {
	if now.Before(a.next) {
		return nil
	}
	demands := lease.IdentityDemands(a.meter, now.UnixMilli(), a.grant, a.p.Limits(), 1, lease.Reported(a.p.IdentityShareLimit()), func(id string) string { return id })
	changes := a.report.Changes(demands, a.p.Limits().Amount(), leaseapi.MaxIdentityDemands)
	a.seq++
	req := &pb.LeaseRequest{Region: a.name, Instance: a.name + "-1", Nonce: a.name + "-bench", Quotas: []*pb.QuotaRequest{{
		Quota: a.p.Name, GrantId: a.grant.ID, Seq: a.seq, Demand: a.p.Limits().RateAmount(a.meter.Rate(now.UnixMilli())),
		IdentityDemand: changes, IdentityDemandHeld: int32(a.report.Len()), IdentityDeltas: true}}}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := lc.Lease(cctx, req)
	if err != nil {
		return fmt.Errorf("%s: %w", a.name, err)
	}
	g := resp.Grants[0]
	grant, _, err := leaseapi.DecodeGrant(g, a.p.Algorithm, resp.Epoch, a.grant)
	if err != nil {
		a.grant, a.report = lease.Grant{}, lease.DemandReport{} // ask anew
		a.next = now
		return nil
	}
	a.report.Answered(changes, !g.IdentityDemandReset)
	a.sent += proto.Size(req)
	a.recv += proto.Size(resp)
	wholeAnswer := proto.Clone(resp).(*pb.LeaseResponse)
	wholeAnswer.Grants[0].IdentityAmounts, wholeAnswer.Grants[0].IdentityDefault, wholeAnswer.Grants[0].IdentityBase = grant.Identities, nil, ""
	a.whole += proto.Size(wholeAnswer)
	a.renewals++
	a.grant = grant
	a.next = now.Add(time.Duration(g.RenewAfterMs) * time.Millisecond)
	return nil
}

// scaleCoordinator is the coordinator process under test.
type scaleCoordinator struct {
	cmd            *exec.Cmd
	addr, httpAddr string
}

func (c *scaleCoordinator) pid() int { return c.cmd.Process.Pid }

// metric reads one unlabelled metric from the coordinator's /metrics.
func (c *scaleCoordinator) metric(t *testing.T, name string) float64 {
	for _, s := range scrape(t, http.DefaultClient, "http://"+c.httpAddr+"/metrics") {
		if s.name == name && s.labels == "" {
			return s.value
		}
	}
	t.Fatalf("no %s in the coordinator's metrics", name)
	return 0
}

// startScaleCoordinator starts one coordinator (embedded etcd, plaintext
// on loopback) with the benchmark's policy and regions, stopped at the
// test's end.
func startScaleCoordinator(t *testing.T, ctx context.Context) *scaleCoordinator {
	dir := t.TempDir()
	c := &scaleCoordinator{addr: testenv.FreeAddr(t), httpAddr: testenv.FreeAddr(t)}
	c.cmd = exec.Command(bins.Coordinator, "serve", "--insecure", "--listen", c.addr, "--http-listen", c.httpAddr,
		"--data-dir", filepath.Join(dir, "etcd"), "--regions", strings.Join(scaleRegions, ","), "--lease-duration", "10s",
		"--rebalance-interval", "1s", "--log-level", "warn")
	logf, err := os.Create(filepath.Join(dir, "coordinator.log"))
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the test, even one that times out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	testenv.WaitFor(t, 30*time.Second, "the coordinator leads", func() bool {
		resp, err := http.Get("http://" + c.httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	pf := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pf, []byte(scalePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, bins.Coordinator, "quota", "set", "-f", pf, "--coordinator", c.addr).CombinedOutput(); err != nil {
		t.Fatalf("quota set: %v\n%s", err, out)
	}
	return c
}
