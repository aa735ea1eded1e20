package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// A region's certificate flooding Lease calls with new identity demands,
// under several instance names, gets no more held than its region may
// hold (lease.HeldFor), and another region renewing meanwhile never fails
// a renewal: planning stays bounded however much is sent.
func TestIdentityDemandFlood(t *testing.T) {
	r, adm, cl := startLeader(t, fmt.Sprintf("/flood-%d", time.Now().UnixNano()), "c1", nil)
	setPolicy(t, adm, policy100)
	ctx := t.Context()
	eu := newTestAgent(t, cl, "eu", "api", 100)
	if err := eu.renew(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	failed := make(chan error, 1)
	var slowest time.Duration
	go func() { // eu renews every 50 ms while the flood lasts, each within its grant's validity
		defer close(failed)
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			rctx, cancel := context.WithTimeout(ctx, testTiming.ValidFor)
			start := time.Now()
			err := eu.renew(rctx)
			slowest = max(slowest, time.Since(start))
			cancel()
			if err != nil {
				failed <- err
				return
			}
		}
	}()
	const workers, calls = 3, 40
	// us floods: every call of the flood must be answered.
	if _, err := testenv.FloodIdentityDemands(t, cl.Lease, "us", "api", workers, calls, time.Minute); err != nil {
		t.Error(err)
	}
	close(done)
	if err := <-failed; err != nil {
		t.Fatalf("eu's renewal failed during the flood: %v", err)
	}
	held, ignored := identityDemandsHeld(r.c, "api")
	if most := lease.HeldFor(1000).Region; held > most {
		t.Errorf("the plan holds %d identity demands, more than a region may (%d)", held, most)
	}
	if ignored == 0 {
		t.Error("no identity demand was counted as ignored")
	}
	t.Logf("%d calls of %d identities: %d held, %d ignored; eu renewed %d times, the slowest in %v", workers*calls, leaseapi.MaxIdentityDemands, held, ignored, eu.renewals.Load(), slowest)
}

// identityDemandsHeld reads quota name's plan: the demands held and ignored.
func identityDemandsHeld(c *Coordinator, name string) (held int, ignored int64) {
	withQuota(c, name, func(q *quotaState) { held, ignored = q.ids.Held(), q.ids.Ignored })
	return held, ignored
}
