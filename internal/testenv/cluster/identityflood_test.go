package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// homedPolicy is a per-tenant limit whose tenants each send from one
// region: the identity shares give that region the tenant's whole limit.
const homedPolicy = `
name: homed
identity: [tenant]
limit: 20
period: 1s
burst: 20
failure: {mode: static-share, static_fraction: 0.1}
`

// A caller holding region us's certificate floods the coordinator process
// with Lease calls of new identity demands (3 instance names, 40 calls
// each of the most a call may carry, each identity at 2^62), while eu's
// agent serves a tenant homed in eu at twice its limit. eu's renewals
// never fail, its tenant keeps at least 90% of its limit, and the
// coordinator stays under 256 MB.
func TestIdentityDemandFloodOverRealProcesses(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, homedPolicy)
	ctx := t.Context()
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	eu := c.RegionAgents("eu")[0]
	home := steady("homed", "tenant", 1, 0, map[string]float64{"eu": 40})
	NewDriver(c).Run(ctx, 5*time.Second, home) // the tenant's share moves home to eu
	failsBefore := scrapeMetric(t, eu, "quotalease_agent_lease_renew_failures_total")

	attacker := pb.NewLeaseServiceClient(dial(t, leader.Addr, c.pki.regions["us"]))
	const workers, calls, flood = 3, 40, 10 * time.Second
	lease := func(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
		return attacker.Lease(ctx, req)
	}
	var sent int
	d := runWhile(t, c, flood, func() {
		// Calls refused or too slow are part of a flood: only eu's service counts.
		sent, _ = testenv.FloodIdentityDemands(t, lease, "us", "homed", workers, calls, 5*time.Second)
	}, home)
	rss := procStatus(t, leader.Pid(), "VmRSS") / 1024 // MB
	fails := scrapeMetric(t, eu, "quotalease_agent_lease_renew_failures_total") - failsBefore
	st := d.Stats("homed")["eu"]
	t.Logf("%d identity demands accepted from the flood; eu: %s; eu renewal failures %v; coordinator RSS %d MB",
		sent, st.Describe(), fails, rss)
	if fails > 0 {
		t.Errorf("eu's agent failed %v renewals during the flood", fails)
	}
	if want := int64(0.9 * 20 * flood.Seconds()); st.Admitted < want {
		t.Errorf("eu's homed tenant admitted %d during the flood, want at least %d (90%% of its limit)", st.Admitted, want)
	}
	if st.Modes["degraded"] > 0 {
		t.Errorf("eu's checks went degraded during the flood: %s", st.Describe())
	}
	if rss >= 256 {
		t.Errorf("coordinator RSS %d MB, want under 256", rss)
	}
	noErrors(t, d, "homed")
}
