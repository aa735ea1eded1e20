package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

var failClosed = policy.Failure{Mode: policy.FailClosed}

const M = policy.Micro

// watcher samples, every few ms, the sum of what the agents enforce (the
// ground truth) and the leader's booked sum, and records violations.
type watcher struct {
	mu         sync.Mutex
	violations []string
	samples    int
	// ledger, when set, reads the sum of the etcd ledger's marks for the
	// quota: a successor restores them all at once, so they must never sum
	// above the limit either.
	ledger func() int64
}

// ledgerSum returns a reader of the sum of quota "api"'s marks in etcd.
func ledgerSum(t *testing.T, prefix string) func() int64 {
	cli := etcdClient(t)
	t.Cleanup(func() { cli.Close() })
	k := keys{prefix}
	return func() int64 {
		resp, err := cli.Get(context.Background(), k.ledgerQuota("api"), clientWithPrefix()...)
		if err != nil {
			return 0
		}
		var sum int64
		for _, kv := range resp.Kvs {
			var l ledgerRecord
			if json.Unmarshal(kv.Value, &l) == nil {
				sum += l.Amount
			}
		}
		return sum
	}
}

func (w *watcher) run(ctx context.Context, limit int64, agents []*testAgent, leader func() *replica) {
	for ctx.Err() == nil {
		var sum int64
		for _, a := range agents {
			amt, mode := a.enforcing()
			if mode == lease.ModeLeased || mode == lease.ModeDegraded {
				sum += amt
			}
		}
		var booked int64 = -1
		if l := leader(); l != nil {
			withQuota(l.c, "api", func(q *quotaState) { booked = q.book.MostBooked(time.Now()) })
		}
		w.mu.Lock()
		w.samples++
		if sum > limit {
			w.violations = append(w.violations, "agents enforce "+itoa(sum)+" > limit")
		}
		if booked > limit {
			w.violations = append(w.violations, "coordinator books "+itoa(booked)+" > limit")
		}
		if w.ledger != nil {
			if l := w.ledger(); l > limit {
				w.violations = append(w.violations, "etcd ledger marks sum to "+itoa(l)+" > limit")
			}
		}
		w.mu.Unlock()
		time.Sleep(3 * time.Millisecond) // the sampling pace
	}
}

func (w *watcher) check(t *testing.T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.violations) > 0 {
		t.Fatalf("%d of %d samples violated the limit, first: %s", len(w.violations), w.samples, w.violations[0])
	}
	if w.samples < 50 {
		t.Fatalf("only %d samples taken", w.samples)
	}
}

func itoa(v int64) string { return fmt.Sprint(float64(v) / float64(M)) }

// Three agents in three regions lease a 100 req/s quota; demand shifts
// from one region to another; shares follow within the damping limit, and
// the sum of may-be-enforcing shares stays <= 100 at every sample.
func TestSharesFollowDemand(t *testing.T) {
	prefix := testenv.Prefix(t)
	r, adm, cl := startLeader(t, prefix, "c1", nil)
	setPolicy(t, adm, policy100)
	agents := regionAgents(t, cl, 80*M, 10*M, 10*M)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := watcher{ledger: ledgerSum(t, prefix)}
	go w.run(ctx, 100*M, agents, func() *replica { return r })
	for _, a := range agents {
		go a.loop(ctx, 100*time.Millisecond)
	}
	share := func(a *testAgent) int64 { amt, _ := a.enforcing(); return amt }
	testenv.WaitFor(t, 5*time.Second, "initial split 80/10/10", func() bool {
		return share(agents[0]) >= 79*M && share(agents[1]) >= 9*M && share(agents[2]) >= 9*M
	})

	// Demand moves from us to eu. The damping limit is 10% of the quota per
	// 50 ms round, so eu cannot go from 10 to 80 in fewer than 7 rounds.
	shift := time.Now()
	agents[0].demand.Store(10 * M)
	agents[1].demand.Store(80 * M)
	testenv.WaitFor(t, 10*time.Second, "eu to reach 75", func() bool { return share(agents[1]) >= 75*M })
	if took := time.Since(shift); took < 300*time.Millisecond {
		t.Fatalf("eu's share moved from 10 to 75 in %v: faster than the damping allows", took)
	}
	testenv.WaitFor(t, 10*time.Second, "us to shrink to 11", func() bool { return share(agents[0]) <= 11*M })
	cancel()
	w.check(t)
}

// Two replicas; the leader is killed while agents renew. The follower
// takes over, honours the outstanding grants (read from the ledger), and
// at no moment do the agents together enforce more than the limit.
func TestLeaderFailover(t *testing.T) {
	prefix := testenv.Prefix(t)
	r1 := startReplica(t, prefix, "c1", nil)
	leader := waitLeader(t, r1)
	r2 := startReplica(t, prefix, "c2", nil)
	adm, _ := admin(t, leader.addr)
	setPolicy(t, adm, policy100)
	_, cl := admin(t, r1.addr, r2.addr)
	agents := regionAgents(t, cl, 20*M, 50*M, 80*M)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	current := leader
	w := watcher{ledger: ledgerSum(t, prefix)}
	go w.run(ctx, 100*M, agents, func() *replica { mu.Lock(); defer mu.Unlock(); return current })
	// The agents renew until the crash and again after the check of what
	// the new leader restored: a renewal meanwhile could acknowledge a
	// smaller grant from the new leader, which then rightly books less
	// than the snapshot taken before the crash.
	var loops sync.WaitGroup
	renewing := func(ctx context.Context) {
		for _, a := range agents {
			loops.Add(1)
			go func() { defer loops.Done(); a.loop(ctx, 50*time.Millisecond) }()
		}
	}
	before, stopRenewing := context.WithCancel(ctx)
	renewing(before)
	testenv.WaitFor(t, 5*time.Second, "all agents leased with a share", func() bool {
		for _, a := range agents {
			if amt, m := a.enforcing(); m != lease.ModeLeased || amt == 0 {
				return false
			}
		}
		return true
	})
	// Shift demand so shares are moving when the leader dies: us's grows
	// as ap's shrinks.
	usBefore, _ := agents[0].enforcing()
	agents[0].demand.Store(90 * M)
	agents[2].demand.Store(5 * M)
	testenv.WaitFor(t, 5*time.Second, "us's share to grow", func() bool { amt, _ := agents[0].enforcing(); return amt > usBefore })
	stopRenewing()
	loops.Wait()
	oldEpoch := leader.c.Epoch()
	held := map[string]int64{}
	heldUntil := map[string]time.Time{}
	for _, a := range agents {
		held[a.region], _ = a.enforcing()
		_, heldUntil[a.region] = a.grant()
	}
	leader.crash()

	next := waitLeader(t, r2)
	mu.Lock()
	current = next
	mu.Unlock()
	if next.c.Epoch() <= oldEpoch {
		t.Fatalf("new epoch %d not above %d", next.c.Epoch(), oldEpoch)
	}
	// The new leader restored every region's grant from the ledger.
	leases, err := pb.NewAdminServiceClient(mustConn(t, cl, r2.addr)).ListLeases(t.Context(), &pb.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	restored := map[string]int64{}
	for _, l := range leases.Leases {
		restored[l.Region] = l.Enforcing
	}
	for region, amt := range held {
		if amt > 0 && restored[region] < amt {
			t.Fatalf("region %s enforced %d at the crash; the new leader books %d (%v)", region, amt, restored[region], leases.Leases)
		}
	}
	// Agents keep working against the new leader: each holds its grant
	// past the end of the one it held at the crash, while the watcher
	// samples.
	renewing(ctx)
	for _, a := range agents {
		testenv.WaitFor(t, 10*time.Second, a.region+" to outlive its grant of the old leader on one of the new", func() bool {
			g, _ := a.grant()
			return g.Epoch == next.c.Epoch() && time.Now().After(heldUntil[a.region])
		})
		if _, m := a.enforcing(); m != lease.ModeLeased {
			t.Fatalf("agent %s is %s after failover, want leased", a.region, m)
		}
	}
	cancel()
	w.check(t)
}

// ledgerSettled reports whether r leads and its flush loop has no lowered
// mark of quota name left to write. flushQuota holds the quota's lock
// from computing its write until the book records it, so none is in
// flight either.
func ledgerSettled(r *replica, name string) bool {
	var settled bool
	return withQuota(r.c, name, func(q *quotaState) { settled = len(q.book.Shrunk(r.c.cfg.Clock.Now())) == 0 }) && settled
}

func mustConn(t *testing.T, cl *leaseapi.Client, addr string) grpcConn {
	cc, err := cl.Conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

// A region that stops renewing keeps its degraded budget reserved, visible
// in ListLeases, until an SRE releases it.
func TestDegradedBudgetStaysReserved(t *testing.T) {
	_, adm, cl := startLeader(t, testenv.Prefix(t), "c1", nil)
	setPolicy(t, adm, policy100+"failure: {mode: static-share, static_fraction: 0.2}\n")
	agents := regionAgents(t, cl, 100*M, 100*M, 100*M)
	us, eu, ap := agents[0], agents[1], agents[2]
	for _, a := range agents {
		if err := a.renew(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go us.loop(ctx, 100*time.Millisecond)
	go eu.loop(ctx, 100*time.Millisecond)
	apCtx, apStop := context.WithCancel(ctx)
	go ap.loop(apCtx, 100*time.Millisecond)
	testenv.WaitFor(t, 5*time.Second, "ap to hold its static share", func() bool { amt, _ := ap.enforcing(); return amt >= 20*M })
	apStop()
	// ap renews no more. Once its lease lapsed, its 20 stay reserved.
	var apLease *pb.LeaseRecord
	testenv.WaitFor(t, 5*time.Second, "ap to be degraded", func() bool {
		ls, err := adm.ListLeases(t.Context(), &pb.ListLeasesRequest{Region: "ap"})
		if err != nil || len(ls.Leases) != 1 {
			return false
		}
		apLease = ls.Leases[0]
		return apLease.State == "degraded"
	})
	if apLease.Reserved != 20*M {
		t.Fatalf("ap reserved %d, want 20", apLease.Reserved)
	}
	// us and eu, asking for 100 each, renew a few times and never get
	// ap's reserved 20.
	usFrom, euFrom := us.renewals.Load(), eu.renewals.Load()
	testenv.WaitFor(t, 5*time.Second, "us and eu to renew 3 times while ap's share is reserved", func() bool {
		usAmt, _ := us.enforcing()
		euAmt, _ := eu.enforcing()
		if usAmt+euAmt > 80*M {
			t.Fatalf("us+eu hold %d while ap's 20 are reserved", usAmt+euAmt)
		}
		return us.renewals.Load() >= usFrom+3 && eu.renewals.Load() >= euFrom+3
	})
	// An SRE releases ap: us and eu may now use all of it.
	if _, err := adm.ReleaseRegion(t.Context(), &pb.ReleaseRegionRequest{Region: "ap"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "us+eu to use the released share", func() bool {
		a, _ := us.enforcing()
		b, _ := eu.enforcing()
		return a+b > 95*M
	})
	// A region with a live lease cannot be released.
	_, err := adm.ReleaseRegion(t.Context(), &pb.ReleaseRegionRequest{Region: "us"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("release of a live region: %v", err)
	}
}

// Deleting a policy and recreating it under the same name (the runbook's
// way to change its algorithm) cannot grant the limit twice: agents that
// have not reloaded yet keep enforcing the old grants until they end, so
// the new policy starts with them reserved. Sampled every few ms, the
// fractions the old and the new agents may enforce sum to at most 1.
func TestDeleteAndRecreateCannotGrantTwice(t *testing.T) {
	_, adm, cl := startLeader(t, testenv.Prefix(t), "c1", nil)
	setPolicy(t, adm, policy100)
	old := regionAgents(t, cl, 100*M, 100*M, 100*M)
	ctx := t.Context()
	sum := func(as []*testAgent) int64 {
		var s int64
		for _, a := range as {
			amt, _ := a.enforcing()
			s += amt
		}
		return s
	}
	testenv.WaitFor(t, 5*time.Second, "the old policy fully granted", func() bool {
		for _, a := range old {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			a.renew(rctx)
			cancel()
		}
		return sum(old) >= 99*M
	})
	if _, err := adm.DeletePolicy(ctx, &pb.DeletePolicyRequest{Name: "api"}); err != nil {
		t.Fatal(err)
	}
	// Recreated with another burst (the test agents read token-bucket
	// grants; another algorithm carries over the same way, as a fraction).
	setPolicy(t, adm, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nburst: 50\n")
	fresh := regionAgents(t, cl, 100*M, 100*M, 100*M)
	for _, a := range fresh { // agents that reloaded: new processes of the new policy
		a.nonce += "-new"
		a.instance = a.region + "-2"
	}
	deadline := time.Now().Add(3 * testTiming.ValidFor)
	worst, newMax := int64(0), int64(0)
	for time.Now().Before(deadline) {
		for _, a := range fresh {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			if err := a.renew(rctx); err != nil {
				t.Logf("renew %s: %v", a.region, err)
			}
			cancel()
		}
		o, n := sum(old), sum(fresh)
		worst, newMax = max(worst, o+n), max(newMax, n)
		if o+n > 100*M {
			t.Fatalf("old agents may enforce %s and new ones %s of the recreated 100", itoa(o), itoa(n))
		}
		time.Sleep(5 * time.Millisecond) // paces the renewals; the sum is checked on each
	}
	if newMax < 99*M {
		t.Fatalf("the recreated policy was granted at most %s once the old grants ended", itoa(newMax))
	}
	t.Logf("worst sum %s; the new policy reached %s", itoa(worst), itoa(newMax))
}

// Bad input gets a clear error and changes nothing in etcd.
func TestBadInputChangesNothing(t *testing.T) {
	prefix := testenv.Prefix(t)
	r, adm, cl := startLeader(t, prefix, "c1", nil)
	setPolicy(t, adm, policy100)
	a := newTestAgent(t, cl, "us", "api", 100*M)
	a.demand.Store(10 * M)
	if err := a.renew(t.Context()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the flush loop to have no lowered mark left to write", func() bool { return ledgerSettled(r, "api") })
	rev := func() int64 {
		resp, err := r.cli.Get(t.Context(), prefix+"/", clientWithPrefix()...)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	before := rev()
	ctx := t.Context()
	// setting and leasing are the refused calls of most cases: a SetPolicy
	// of yaml, a Lease call of req.
	setting := func(yaml string) func() error {
		return func() error { _, err := adm.SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: yaml}); return err }
	}
	leasing := func(req *pb.LeaseRequest) func() error {
		return func() error { _, err := cl.Lease(ctx, req); return err }
	}
	adminCases := []struct {
		call func() error
		code codes.Code
		text string
	}{
		{setting("name: x\nidentity: [tenant]\nlimit: .nan\nperiod: 1s\n"), codes.InvalidArgument, `field "limit"`},
		{setting(policy100 + "floors: {us: 60, eu: 50}\n"),
			codes.InvalidArgument, "below the sum of the regions' floors"},
		{setting(policy100 + "failure: {mode: static-share, static_fraction: 0.4}\n"),
			codes.InvalidArgument, "need 120% of the quota"},
		{setting(policy100 + "burst: 2\n"), codes.InvalidArgument, "raise burst to at least 3 x cost"},
		{setting(policy100 + "floors: {mars: 5}\n"), codes.InvalidArgument, `unknown region "mars"`},
		{setting(strings.Replace(policy100, "limit: 100", "limit: 100\nalgorithm: fixed_window", 1)),
			codes.FailedPrecondition, "changing algorithm"},
		{setting(policy100 + "shards: 4\n"), codes.FailedPrecondition, "change the version with it"},
		{func() error {
			_, err := adm.SetRegion(ctx, &pb.SetRegionRequest{Name: "EU West", Weight: 1})
			return err
		}, codes.InvalidArgument, "region name"},
		{func() error { _, err := adm.SetRegion(ctx, &pb.SetRegionRequest{Name: "eu", Weight: -1}); return err },
			codes.InvalidArgument, "weight"},
		{func() error { _, err := adm.ListLeases(ctx, &pb.ListLeasesRequest{Region: "mars"}); return err },
			codes.NotFound, "unknown region"},
		{func() error { _, err := adm.DeletePolicy(ctx, &pb.DeletePolicyRequest{Name: "nope"}); return err },
			codes.NotFound, "no policy"},
		{leasing(&pb.LeaseRequest{Region: "mars", Instance: "i", Nonce: "n",
			Quotas: []*pb.QuotaRequest{{Quota: "api"}}}), codes.InvalidArgument, `unknown region "mars"`},
		{leasing(&pb.LeaseRequest{Region: "us", Instance: "i", Nonce: "n",
			Quotas: []*pb.QuotaRequest{{Quota: "api"}, {Quota: "api"}}}), codes.InvalidArgument, "named twice"},
		{leasing(&pb.LeaseRequest{Region: "us", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api"}}}),
			codes.InvalidArgument, "instance"},
	}
	for i, c := range adminCases {
		err := c.call()
		if status.Code(err) != c.code || !strings.Contains(err.Error(), c.text) {
			t.Errorf("case %d: %v, want %s mentioning %q", i, err, c.code, c.text)
		}
	}
	grantCases := []struct {
		q    *pb.QuotaRequest
		inst string
		code pb.GrantError
	}{
		{&pb.QuotaRequest{Quota: "nope", Seq: 100}, a.instance, pb.GrantError_GRANT_ERROR_UNKNOWN_QUOTA},
		{&pb.QuotaRequest{Quota: "api", GrantId: "999999.1", Seq: 101}, a.instance, pb.GrantError_GRANT_ERROR_UNKNOWN_GRANT},
		{&pb.QuotaRequest{Quota: "api", GrantId: "1.1", Seq: 102}, a.instance, pb.GrantError_GRANT_ERROR_STALE_GRANT},
	}
	for i, c := range grantCases {
		resp, err := cl.Lease(t.Context(), &pb.LeaseRequest{Region: "us", Instance: c.inst, Nonce: a.nonce, Quotas: []*pb.QuotaRequest{c.q}})
		if err != nil || resp.Grants[0].Code != c.code || resp.Grants[0].Error == "" {
			t.Errorf("grant case %d: %v %v, want %s", i, resp, err, c.code)
		}
	}
	// A second process with the same instance id while the first one
	// renews: the newcomer is refused, with how long to wait, and the first
	// keeps its name.
	other := newTestAgent(t, cl, "us", "api", 100*M)
	other.instance, other.nonce = a.instance, "another-process"
	before = rev()
	err := other.renew(t.Context())
	if wait, held := leaseapi.InstanceHeld(err, 0); !held || wait <= 0 || wait > testTiming.ValidFor || !strings.Contains(err.Error(), "held by another agent process") {
		t.Fatalf("duplicate instance: %v (retry in %v)", err, wait)
	}
	if after := rev(); after != before {
		t.Fatalf("refused requests changed etcd: revision %d -> %d", before, after)
	}
	if err := a.renew(t.Context()); err != nil {
		t.Fatalf("the first process lost its name: %v", err)
	}
}

// A follower refuses lease calls naming the leader, and the client follows.
func TestFollowerRedirects(t *testing.T) {
	prefix := testenv.Prefix(t)
	r1 := startReplica(t, prefix, "c1", nil)
	waitLeader(t, r1)
	r2 := startReplica(t, prefix, "c2", nil)
	adm, _ := admin(t, r1.addr)
	setPolicy(t, adm, policy100)
	testenv.WaitFor(t, 5*time.Second, "follower to observe the leader", func() bool { s, _ := r2.c.leader.Load().(string); return s == r1.addr })
	direct := pb.NewLeaseServiceClient(mustConnAddr(t, r2.addr))
	_, err := direct.Lease(t.Context(), &pb.LeaseRequest{Region: "us", Instance: "i", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api"}}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), r1.addr) {
		t.Fatalf("follower answered %v, want UNAVAILABLE naming %s", err, r1.addr)
	}
	_, cl := admin(t, r2.addr) // knows only the follower
	resp, err := cl.Lease(t.Context(), &pb.LeaseRequest{Region: "us", Instance: "i", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api", Demand: 5 * M, Seq: 1}}})
	if err != nil || resp.Grants[0].GrantId == "" {
		t.Fatalf("client did not follow the redirect: %v %v", resp, err)
	}
	// With hints off, a client that knows only the follower never reaches
	// the leader: it keeps to the addresses it was given.
	_, strict := admin(t, r2.addr)
	strict.SetFollowHints(false)
	// It fails with the follower's UNAVAILABLE, or runs out of time while
	// asking it again (on a loaded machine an attempt may outlast the
	// deadline); it never succeeds.
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err = strict.Lease(ctx, &pb.LeaseRequest{Region: "us", Instance: "i", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api", Seq: 2}}})
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("client with hints off: %v, want UNAVAILABLE (or DEADLINE_EXCEEDED)", err)
	}
}
