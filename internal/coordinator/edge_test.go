package coordinator

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// The edge summaries agents send with their renewals reach the admin
// API: ListLeases shows, per region, the sum over its agent instances
// (and how many reported), usage beyond the quota's total included; an
// instance that reports none is forgotten at once, one that stops
// renewing once its grant ends; a negative summary, or one with more
// library clients than instances, is refused whole and
// changes nothing; a renewal without one (an older agent) works as before.
func TestEdgeSummariesInListLeases(t *testing.T) {
	_, adm, cl := startLeader(t, testenv.Prefix(t), "c1", nil)
	setPolicy(t, adm, policy100)
	ctx := t.Context()
	renew := func(region, instance string, edge *pb.EdgeSummary) error {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := cl.Lease(rctx, &pb.LeaseRequest{Region: region, Instance: instance, Nonce: instance + "-nonce",
			Quotas: []*pb.QuotaRequest{{Quota: "api", Seq: uint64(time.Now().UnixNano()), Demand: 10 * M, Edge: edge}}})
		return err
	}
	edgeOf := func(region string) *pb.EdgeSummary { return leaseOf(t, adm, "api", region).GetEdge() }

	if err := renew("eu", "eu-1", nil); err != nil {
		t.Fatalf("a renewal without an edge summary: %v", err)
	}
	if e := edgeOf("eu"); e != nil {
		t.Fatalf("a region whose agent sent no summary shows edge %v", e)
	}
	if err := renew("us", "us-1", &pb.EdgeSummary{Instances: 3, LibraryInstances: 1, Buckets: 7, Assigned: 40 * M, Usage: 55 * M}); err != nil {
		t.Fatal(err)
	}
	if err := renew("us", "us-2", &pb.EdgeSummary{Instances: 2, LibraryInstances: 2, Buckets: 2, Assigned: 10 * M, Usage: 500 * M}); err != nil {
		t.Fatal(err)
	}
	want := &pb.EdgeSummary{Instances: 5, LibraryInstances: 3, Buckets: 9, Assigned: 50 * M, Usage: 555 * M, Agents: 2}
	if got := edgeOf("us"); !proto.Equal(got, want) {
		t.Fatalf("us's edge: %v, want %v", got, want)
	}
	if e := edgeOf("eu"); e != nil {
		t.Fatalf("eu shows us's edge: %v", e)
	}

	for _, bad := range []*pb.EdgeSummary{{Instances: -1}, {Instances: 1, LibraryInstances: 2}} {
		if err := renew("us", "us-2", bad); code(err) != codes.InvalidArgument {
			t.Fatalf("edge summary %v: %v, want InvalidArgument", bad, err)
		}
	}
	if got := edgeOf("us"); !proto.Equal(got, want) {
		t.Fatalf("a refused renewal changed us's edge: %v, want %v", got, want)
	}

	if err := renew("us", "us-2", nil); err != nil { // its Envoy instances went away
		t.Fatal(err)
	}
	want = &pb.EdgeSummary{Instances: 3, LibraryInstances: 1, Buckets: 7, Assigned: 40 * M, Usage: 55 * M, Agents: 1}
	if got := edgeOf("us"); !proto.Equal(got, want) {
		t.Fatalf("us's edge after us-2 reported none: %v, want %v", got, want)
	}
	// us-1 stops renewing: its summary goes when its grant ends.
	start := time.Now()
	testenv.WaitFor(t, 5*time.Second, "us-1's edge summary dropped", func() bool { return edgeOf("us") == nil })
	if held := time.Since(start); held < testTiming.ValidFor/2 {
		t.Fatalf("us-1's summary was dropped after %v, before its grant (valid %v) could end", held, testTiming.ValidFor)
	}
}

// Summaries are kept per instance and pruned as they end, so instances
// that come and go leave nothing behind; sums saturate.
func TestEdgeReportsPruneAndSaturate(t *testing.T) {
	var r edgeReports
	hold := 10 * time.Second
	for i := range 1000 {
		r.record("us", string(rune('a'+i%26))+time.Duration(i).String(), &pb.EdgeSummary{Instances: 1}, time.Duration(i)*time.Second, hold)
	}
	if n := len(r.by); n > 2*minSweep+20 {
		t.Fatalf("%d reports kept, most of them ended", n)
	}
	if s := r.region("us", 1000*time.Second); s == nil || s.Agents > 10 {
		t.Fatalf("at the end, %v: want the last 10 instances' reports", s)
	}
	var big edgeReports
	for _, in := range []string{"a", "b"} {
		big.record("us", in, &pb.EdgeSummary{Instances: 1 << 30, Buckets: 1 << 30, Assigned: 1 << 62, Usage: 1 << 62}, 0, hold)
	}
	if s := big.region("us", 0); s.Instances != 1<<31-1 || s.Assigned != 1<<63-1 {
		t.Fatalf("sums wrapped: %v", s)
	}
}
