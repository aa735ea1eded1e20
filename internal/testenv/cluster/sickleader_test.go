package cluster

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// The leader is stopped (SIGSTOP) for 20 s under load: a hung leader, its
// connections open, its etcd session expiring. Agents mark it suspect
// after one attempt and renew with the follower as soon as it leads, well
// within their leases, so no region leaves its lease: not one check is
// decided on a degraded budget or fails. Before, a deadline exceeded was
// taken as the hung leader's answer, and every region was degraded within
// 10 s.
func TestE2ELeaderPaused(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := startWith(t, globalPolicy, Options{LeaseDuration: 8 * time.Second, SessionTTL: 2 * time.Second})
	ctx := t.Context()
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Agents { // every region holds its lease before the load starts
		waitLeased(t, a, "api-global", "api", 20*time.Second)
	}
	d := runWhile(t, c, 26*time.Second, func() {
		time.Sleep(3 * time.Second)
		leader.Pause()
		time.Sleep(20 * time.Second)
		leader.Resume()
	}, steady("api-global", "api", 1, 0, map[string]float64{"us": 20, "eu": 20, "ap": 20}))
	for region, st := range d.Stats("api-global") {
		t.Logf("%s: %s", region, st.Describe())
		if st.Modes["degraded"] > 0 || st.Modes["unleased"] > 0 || st.Errors > 0 {
			t.Errorf("%s left its lease while the leader hung: %s", region, st.Describe())
		}
		if st.Modes["leased"] == 0 {
			t.Errorf("%s decided nothing leased: %s", region, st.Describe())
		}
	}
	if now := c.Leader(ctx); now == nil || now == leader {
		t.Fatalf("leader after the pause: %v, want the follower", now)
	}
}
