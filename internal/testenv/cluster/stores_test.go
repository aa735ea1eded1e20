package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// A region on a Redis Cluster of three masters and one on Redis Sentinel
// pass the end-to-end checks while their stores fail as such deployments
// do: a cluster master is killed and restarts empty (its slots' birth
// markers gone with its keys), and the Sentinel's master is killed, so the
// Sentinel promotes the replica. Agents decide on the local fallback
// meanwhile and on the new master after; no identity's window exceeds the
// bound, counted from the client's records, and no check fails.
func TestE2ERedisClusterAndSentinel(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := startWith(t, globalPolicy+"---\n"+tenantPolicy, Options{Stores: map[string]string{"us": StoreCluster, "eu": StoreSentinel}})
	ctx := t.Context()
	global := steady("api-global", "api", 1, 0, map[string]float64{"us": 30, "eu": 30, "ap": 20})
	tenants := steady("per-tenant", "tenant", 40, 0.3, map[string]float64{"us": 40, "eu": 40, "ap": 10})
	var promoted time.Time
	d := runWhile(t, c, 18*time.Second, func() {
		time.Sleep(4 * time.Second)
		se := c.Sentinels["eu"]
		old := se.Master.Addr
		se.Master.Stop() // SIGKILL
		killed := time.Now()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if m, err := se.CurrentMaster(ctx); err == nil && m != old {
				promoted = time.Now()
				t.Logf("the Sentinel promoted %s after %v", m, promoted.Sub(killed).Round(time.Millisecond))
				break
			}
		}
		if promoted.IsZero() {
			t.Fatal("the Sentinel never promoted the replica")
		}
		time.Sleep(2 * time.Second)
		if err := c.RedisClusters["us"].Nodes[0].Restart(); err != nil { // SIGKILL, back empty
			t.Fatal(err)
		}
	}, global, tenants)

	dep := bound.Deployment{RedisOutages: true, StoreLag: time.Second}
	checkBound(t, d, policyOf(t, globalPolicy), dep)
	checkBound(t, d, policyOf(t, tenantPolicy), dep)
	noErrors(t, d, "api-global")
	noErrors(t, d, "per-tenant")
	decidedIn(t, d, "per-tenant", "us", "leased", "us never decided on its Redis Cluster")
	decidedIn(t, d, "api-global", "eu", "local-fallback", "eu never used its fallback: the failover was not felt")
	after := 0
	for _, a := range d.Admissions() {
		if a.Region == "eu" && a.Mode == "leased" && a.At.After(promoted.Add(2*time.Second)) {
			after++
		}
	}
	if after == 0 {
		t.Fatal("eu admitted nothing on the promoted master")
	}
	t.Logf("eu: %d admissions decided on the promoted master", after)
	if log, _ := os.ReadFile(filepath.Join(c.Dir, "agent-us.log")); !strings.Contains(string(log), "Redis lost its quota-lease state") {
		t.Fatal("agent-us never noticed its cluster node restarted empty")
	}
}
