package coordinator

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A client that has talked to one deployment and then reaches another's
// coordinator (its old leader's address now belongs to another cluster)
// is refused before anything is stored there.
func TestWriteNeverLandsInAnotherCluster(t *testing.T) {
	a := startReplica(t, testenv.Prefix(t), "a", nil)
	b := startReplica(t, testenv.Prefix(t), "b", nil)
	waitLeader(t, a)
	waitLeader(t, b)
	if a.c.ClusterID() == "" || a.c.ClusterID() == b.c.ClusterID() {
		t.Fatalf("cluster ids %q and %q: want two distinct ones", a.c.ClusterID(), b.c.ClusterID())
	}
	cl, err := leaseapi.NewClient([]string{a.addr, b.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set := func(name string) error {
		return setPolicyVia(t.Context(), cl, "name: "+name+"\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n")
	}
	if err := set("first"); err != nil {
		t.Fatal(err)
	}
	if cl.ClusterID() != a.c.ClusterID() {
		t.Fatalf("client pinned %q, want a's %q", cl.ClusterID(), a.c.ClusterID())
	}
	a.stop() // the next call goes to b's address
	err = set("second")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "another deployment") {
		t.Fatalf("write after a's address led to b: %v, want FailedPrecondition", err)
	}
	bc, _ := admin(t, b.addr)
	if _, err := bc.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: "second"}); status.Code(err) != codes.NotFound {
		t.Fatalf("b stored the refused policy: %v", err)
	}
	// An explicitly pinned, wrong cluster is refused too.
	cl2, _ := leaseapi.NewClient([]string{b.addr})
	defer cl2.Close()
	cl2.SetClusterID("not-this-one")
	if err := listPolicies(t.Context(), cl2); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("wrongly pinned client: %v", err)
	}
}
