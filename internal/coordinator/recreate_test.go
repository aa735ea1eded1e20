package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Deleting a policy and recreating it under the same name (the runbook's
// way to change its algorithm) cannot grant the limit twice: agents that
// have not reloaded yet keep enforcing the old grants until they end, so
// the new policy starts with them reserved. Sampled every few ms, the
// fractions the old and the new agents may enforce sum to at most 1.
func TestDeleteAndRecreateCannotGrantTwice(t *testing.T) {
	prefix := testenv.Prefix(t)
	r := startReplica(t, prefix, "c1", nil)
	waitLeader(t, r)
	adm, cl := admin(t, r.addr)
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: policy100}); err != nil {
		t.Fatal(err)
	}
	regions := []string{"us", "eu", "ap"}
	var old, fresh []*testAgent
	for _, region := range regions {
		a := newTestAgent(t, cl, region, "api", 100*M)
		a.demand.Store(100 * M)
		old = append(old, a)
	}
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
	if _, err := adm.SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\nburst: 50\n"}); err != nil {
		t.Fatal(err)
	}
	for _, region := range regions { // agents that reloaded: new processes of the new policy
		a := newTestAgent(t, cl, region, "api", 100*M)
		a.nonce += "-new"
		a.instance = region + "-2"
		a.demand.Store(100 * M)
		fresh = append(fresh, a)
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
