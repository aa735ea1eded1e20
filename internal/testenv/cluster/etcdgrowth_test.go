package cluster

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Policy churn does not grow etcd without limit: the leader compacts
// etcd's history (--etcd-compaction-interval), so a second round of 300
// policy changes reuses the pages the first one left and grows the
// database less than the first did. Without compaction every change stays
// in the history and each round grows it by the same amount, towards the
// backend quota and NOSPACE.
func TestEtcdGrowthBounded(t *testing.T) {
	testenv.SkipMultiProcess(t)
	const interval, changes, policies = time.Second, 300, 40
	c := startWith(t, churnPolicies(0, policies), Options{Regions: []string{"us"}, Coordinators: 1,
		CoordinatorArgs: []string{"--etcd-compaction-interval", interval.String()}})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := t.Context()
	// status is the database's size on disk and the part of it in use.
	status := func() (size, inUse int64) {
		t.Helper()
		st, err := cli.Status(ctx, c.etcd)
		if err != nil {
			t.Fatal(err)
		}
		return st.DbSize, st.DbSizeInUse
	}
	// churn makes n changes of every policy's limit and returns the etcd
	// revision after the last.
	churn := func(round int) int64 {
		t.Helper()
		for i := 1; i <= changes; i++ {
			yaml := churnPolicies(round*changes+i, policies)
			if err := c.Admin(ctx, func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
				_, err := a.SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: yaml}, opts...)
				return err
			}); err != nil {
				t.Fatalf("change %d of round %d: %v", i, round, err)
			}
		}
		r, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	// compactedUpTo reports whether etcd's history is compacted up to rev:
	// the revisions before it can no longer be read. (Compacting past rev
	// itself needs a later write, which an idle deployment may not make.)
	compactedUpTo := func(rev int64) bool {
		_, err := cli.Get(ctx, "/", clientv3.WithRev(rev-1), clientv3.WithCountOnly())
		return errors.Is(err, rpctypes.ErrCompacted)
	}

	before, _ := status()
	last := churn(1)
	mid, used := status()
	first := mid - before
	testenv.WaitFor(t, 30*interval, "a compaction up to the first round's end", func() bool { return compactedUpTo(last) })
	// etcd removes the compacted revisions in batches after it records the
	// compaction: wait until most of the first round's pages are free.
	testenv.WaitFor(t, 30*interval, "the first round's history freed", func() bool { _, u := status(); return u < used/2 })
	churn(2)
	after, _ := status()
	second := after - mid
	t.Logf("etcd database: %d bytes before, +%d in the first round of %d changes, +%d in the second",
		before, first, changes, second)
	if first <= 0 {
		t.Fatalf("the first round grew the database by %d bytes: the test writes too little to measure", first)
	}
	if second >= first {
		t.Fatalf("the second round grew etcd's database by %d bytes, the first by %d: its history is not compacted",
			second, first)
	}
}

// churnPolicies is a policy file of n policies whose limits depend on
// version, so that each version changes every policy.
func churnPolicies(version, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "---\nname: churn-%d\nidentity: [tenant]\nlimit: %d\nperiod: 1s\n", i, 1000+version%1000)
	}
	return b.String()
}
