package coordinator

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// A replica that accepts connections and never answers (a hung leader)
// costs one call a share of its deadline: the client marks it suspect
// (that call fails, since its request may have been applied there), and
// every later call reaches the healthy replica first. Before, every call
// went to the hung replica and failed while it hung.
func TestHungReplicaIsSkipped(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	r := startReplica(t, testenv.Prefix(t), "healthy", nil)
	waitLeader(t, r)
	cl, err := leaseapi.NewClient([]string{hung.Addr().String(), r.addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	list := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return listPolicies(ctx, cl)
	}
	if err := list(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call with a hung first replica: %v, want its attempt to time out", err)
	}
	if !cl.Suspect(hung.Addr().String()) || cl.Order()[0] != r.addr {
		t.Fatalf("order after the hang: %v, want the healthy replica first", cl.Order())
	}
	for i := 0; i < 5; i++ {
		if err := list(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// A leader shut down gracefully (SIGTERM) resigns, so its successor leads
// at once, not after the session TTL: with a 10 s TTL the follower must
// lead well before the old session could have expired.
func TestGracefulStopHandsOver(t *testing.T) {
	prefix := testenv.Prefix(t)
	ttl := func(c *Config) { c.SessionTTL = 10 * time.Second }
	a := startReplica(t, prefix, "a", ttl)
	waitLeader(t, a)
	b := startReplica(t, prefix, "b", ttl)
	testenv.WaitFor(t, 5*time.Second, "b to campaign behind a", func() bool {
		resp, err := b.cli.Get(t.Context(), keys{prefix}.election(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	stopped := time.Now()
	a.stop()
	deadline := stopped.Add(5 * time.Second) // half the TTL: no waiting for expiry
	for !b.c.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the follower did not lead within half the session TTL: the old leader did not resign")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("successor leads %v after the stop", time.Since(stopped).Round(time.Millisecond))
}
