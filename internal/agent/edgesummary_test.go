package agent

import (
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/quotalease"
)

// What Envoy instances hold at the edge reaches the coordinator's admin
// API with the agent's renewals: two Envoy instances and a Go service using
// the client library streaming to the agent, four buckets of two tenants,
// show as the region's edge in ListLeases (the library's instance named
// apart),
// its assigned rate the agent's own gauge and its usage what they ask; once
// they are gone, the next renewal clears it.
func TestEdgeSummaryReachesListLeases(t *testing.T) {
	k, ra := coordinatedAgent(t, edgeTestPolicy, fastEdge)
	a, b := startEnvoy(t, ra.grpcAddr, "a"), startEnvoy(t, ra.grpcAddr, "b")
	globex := map[string]string{"policy": "api", "tenant": "globex"}
	stop := make(chan struct{})
	go drive(a, acme, 150, stop, 20*time.Second)
	go drive(b, acme, 50, stop, 20*time.Second)
	go drive(b, globex, 50, stop, 20*time.Second)
	lib, err := quotalease.New(t.Context(), quotalease.Config{Agents: []string{ra.grpcAddr}, Domain: "shop",
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}})
	if err != nil {
		t.Fatal(err)
	}
	go drive(lib, globex, 20, stop, 20*time.Second)
	edgeOf := func() *pb.EdgeSummary {
		resp, err := k.c.Admin().ListLeases(t.Context(), &pb.ListLeasesRequest{Region: "us"})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.Leases {
			if l.Quota == "api" {
				return l.Edge
			}
		}
		return nil
	}
	var got *pb.EdgeSummary
	testenv.WaitFor(t, 15*time.Second, "the edge in ListLeases", func() bool {
		got = edgeOf()
		return got != nil && got.Instances == 3 && got.LibraryInstances == 1 && got.Buckets == 4 && got.Assigned > 0 &&
			got.Usage >= 200*policy.Micro
	})
	t.Logf("ListLeases: %v", got)
	if got.Agents != 1 {
		t.Errorf("%d agents reported, want 1", got.Agents)
	}
	// The summary and the gauge come from the same count; a scrape
	// counts again when the last count is over a second old, so one poll
	// may see them differ.
	testenv.WaitFor(t, 5*time.Second, "the renewal's assigned rate equal to the gauge", func() bool {
		own := ra.a.edge.Summary("api")
		gauge := gaugeValue(t, ra.a, "quotalease_agent_edge_assigned_rate")
		return own != nil && math.Abs(policy.Units(own.Assigned)-gauge) <= 1e-6*gauge
	})
	if lim := 2 * 100 * policy.Micro; got.Assigned > lim { // two tenants, each limited to 100/s
		t.Errorf("assigned %d, more than the two tenants' limits %d", got.Assigned, lim)
	}
	if got.Usage > 440*policy.Micro {
		t.Errorf("usage %d, twice what the instances ask", got.Usage)
	}
	close(stop)
	a.Close()
	b.Close()
	lib.Close()
	testenv.WaitFor(t, 15*time.Second, "the edge gone from ListLeases", func() bool { return edgeOf() == nil })
}
