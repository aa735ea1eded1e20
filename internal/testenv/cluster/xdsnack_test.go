package cluster

import (
	"math/bits"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
)

// A management server that sends a configuration the coordinator refuses
// again after every NACK, against a coordinator process with its default
// backoff: once the first few NACKs went, each waits a second or more
// (unpaced, both loop as fast as they convert: thousands a second), the
// repeated rejection is logged at its 1st, 2nd, 4th, 8th ... repetition
// only, and the coordinator keeps storing what SREs set.
func TestXDSNackLoopPaced(t *testing.T) {
	testenv.SkipMultiProcess(t)
	bad, err := anypb.New(&rlsconf.RateLimitConfig{Name: "bad", Domain: "bad",
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := xdsserver.StartResender(t, bad)
	c := startWith(t, globalPolicy, Options{Regions: []string{"us"}, Coordinators: 1,
		CoordinatorArgs: []string{"--ratelimit-xds", srv.Addr}})
	testenv.WaitFor(t, 30*time.Second, "four NACKs", func() bool { return srv.NACKs() >= 4 })
	from, began := srv.NACKs(), time.Now()
	testenv.WaitFor(t, 30*time.Second, "two more NACKs", func() bool { return srv.NACKs() >= from+2 })
	if took := time.Since(began); took < 2*time.Second {
		t.Errorf("NACKs %d to %d of the same rejection came within %v: not paced to one a second", from, from+2, took)
	}
	n := srv.NACKs()
	log, err := os.ReadFile(filepath.Join(c.Dir, "coordinator-1.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "xDS response rejected") || strings.Contains(l, "keeps sending a configuration that was rejected") {
			lines++
		}
	}
	if want := 1 + bits.Len64(uint64(n)); lines > want {
		t.Errorf("%d log lines for %d NACKs of one rejection, want at most %d (one at each power of two)", lines, n, want)
	}
	if err := c.SetPolicies(t.Context(), tenantPolicy); err != nil {
		t.Fatalf("storing a policy by hand while the xDS server loops: %v", err)
	}
	t.Logf("%d NACKs, %d log lines; NACKs %d to %d took %v", n, lines, from, from+2, time.Since(began))
}
