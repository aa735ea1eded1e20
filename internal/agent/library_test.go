package agent

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/quotalease"
)

// startLibrary starts a client of the quota-lease library streaming to
// addr, reporting every interval, denying without an assignment (as
// edgeTestPolicy states).
func startLibrary(t testing.TB, addr string, every time.Duration) *quotalease.Client {
	t.Helper()
	c, err := quotalease.New(t.Context(), quotalease.Config{Agents: []string{addr}, Domain: "shop", ReportInterval: every,
		Buckets:     envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// libraryRate is the refill of the token bucket the agent assigned c for
// bucket, in requests a second; 0 without one.
func libraryRate(c *quotalease.Client, bucket map[string]string) float64 {
	st, ok := c.State(bucket)
	if !ok || st.Phase != envoy.Assigned || st.Strategy.Kind != envoy.TokenBucket {
		return 0
	}
	return st.Strategy.Bucket.Rate()
}

// A hot bucket's demand moves from one library client to another, both
// reporting every second: the second holds 90% of the region's capacity
// within two report intervals and the life of the first's last larger
// assignment, which the first may enforce until then (1.6-1.7 s on a quiet
// machine: about the report's phase, that life and a change's wait).
func TestLibraryDemandMoves(t *testing.T) {
	const every = time.Second
	ra := regionAgent(t, edgeTestPolicy, fastEdge)
	a, b := startLibrary(t, ra.grpcAddr, every), startLibrary(t, ra.grpcAddr, every)
	stopA, stopB := make(chan struct{}), make(chan struct{})
	defer close(stopB)
	go drive(a, acme, 400, stopA, 20*time.Second)
	b.Allow(acme) // b holds the bucket too, idle
	capacity := func() float64 { return regionRate(ra.a, "api", "acme", 100) }
	testenv.WaitFor(t, 10*time.Second, "a holding most of the region's capacity", func() bool {
		return libraryRate(a, acme) >= 0.9*capacity() && capacity() > 50
	})
	close(stopA)
	moved := time.Now()
	go drive(b, acme, 400, stopB, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "b holding 90% of the region's capacity", func() bool {
		return libraryRate(b, acme) >= 0.9*capacity()
	})
	took := time.Since(moved)
	t.Logf("b got 90%% of the region's capacity %s (%.2f report intervals) after the demand moved; b's stats %+v",
		took.Round(10*time.Millisecond), took.Seconds()/every.Seconds(), b.Stats())
	if limit := 2*every + 1100*time.Millisecond; took > limit {
		t.Errorf("took %s, more than two report intervals and one assignment's life (%s)", took, limit)
	}
}
