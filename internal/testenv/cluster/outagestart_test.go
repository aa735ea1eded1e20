package cluster

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// With etcd and every coordinator down, a region's agent is killed and
// started again, as a crashed pod rescheduled during the outage: from its
// region's Redis it takes the policies and the grant its previous process
// held, serves at once within that share (then its degraded budget), and
// its /readyz is 200; every region's admissions through the outage stay
// within the bound. Nothing in this test waits on a coordinator.
func TestE2EAgentStartsDuringOutage(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	us := c.Agents[0]
	d := NewDriver(c)
	d.Run(ctx, 3*time.Second, steady("api-global", "api", 1, 0, map[string]float64{"us": 20, "eu": 20, "ap": 20}))
	time.Sleep(1500 * time.Millisecond) // a presence round saves the grants
	for _, p := range c.Coords {
		p.Kill()
	}
	c.Etcd.Kill()
	us.Kill()
	began := time.Now()
	if err := us.Restart(); err != nil {
		t.Fatal(err)
	}
	// A connection of its own that retries every 10 ms, so the time measured
	// is the agent's, not a client's reconnection backoff.
	every10ms := backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1, MaxDelay: 10 * time.Millisecond}
	check := pb.NewCheckServiceClient(dial(t, us.Addr, c.pki.service,
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: every10ms, MinConnectTimeout: time.Second})))
	var first *pb.CheckResponse
	for deadline := time.Now().Add(30 * time.Second); first == nil && time.Now().Before(deadline); {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := check.Check(cctx, &pb.CheckRequest{Policy: "api-global", Attributes: map[string]string{"api": "x"}})
		cancel()
		if err == nil && resp.Allowed {
			first = resp
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	served := time.Since(began)
	if first == nil {
		t.Fatal("the restarted agent admitted nothing during the outage")
	}
	t.Logf("restarted agent admitted its first check %v after exec, in mode %s", served.Round(time.Millisecond), first.Mode)
	if first.Mode != "leased" && first.Mode != "degraded" {
		t.Fatalf("first admission in mode %q: want the restored grant (leased) or its degraded budget", first.Mode)
	}
	// Within the share the coordinator counted for us: the restored grant
	// is at most the whole limit of 60/s, and its degraded budget the
	// static share.
	if first.Limit > 60 {
		t.Fatalf("enforcing a limit of %v, above the policy's 60", first.Limit)
	}
	resp, err := us.web.Get(us.HTTP + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz %d %q during the outage: a region serving its saved state is ready", resp.StatusCode, body)
	}
	// Through 5 s more of the outage every region keeps deciding, the
	// restarted one on its restored state, offered well above the limit so
	// that a region enforcing more than the bound counts for it would
	// show: what the client's own records show admitted stays within the
	// published bound.
	d.Run(ctx, 5*time.Second, steady("api-global", "api", 1, 0, map[string]float64{"us": 80, "eu": 40, "ap": 40}))
	checkBound(t, d, policyOf(t, globalPolicy), bound.Deployment{})
	if st := d.Stats("api-global")["us"]; st.Admitted == 0 {
		t.Fatalf("us admitted nothing: %s", st.Describe())
	}
	// By then the restarted agent has said what it started from and
	// warned once that renewals fail: a few lines, not one per attempt.
	b, _ := os.ReadFile(filepath.Join(c.Dir, "agent-us.log"))
	log := string(b)
	log = log[strings.LastIndex(log, "starting: build"):]
	for _, line := range []string{"started from the region's saved policies", "restored the region's saved grants", "lease renewals failing"} {
		if !strings.Contains(log, line) {
			t.Fatalf("the restarted agent's log lacks %q:\n%s", line, log)
		}
	}
	if n := strings.Count(log, "[WARN]") + strings.Count(log, "[ERROR]"); n > 3 {
		t.Fatalf("%d warnings in 5 s of outage, want a few:\n%s", n, log)
	}
}
