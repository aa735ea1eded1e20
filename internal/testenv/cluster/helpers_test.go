package cluster

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/internal/mtls"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// dial connects to addr presenting the certificate files f (mutual TLS),
// or in plaintext where f is the zero Files, with opts besides; the
// connection closes at the end of t. The tests and benchmarks that call a
// process of the cluster (or a peer) directly connect through it.
func dial(t testing.TB, addr string, f mtls.Files, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if f != (mtls.Files{}) {
		var err error
		if creds, err = grpcCreds(f); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// poll calls try until it returns nil, waiting every between calls, and
// fails t with the last error try returned once limit has passed. It
// serves the waits whose failure should say what was last seen, and those
// that poll a process at a pace of their own (testenv.WaitFor polls every
// few ms).
func poll(t testing.TB, limit, every time.Duration, try func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(every)
	}
}

// waitLeased waits, for at most limit, until agent a decides a probe check
// of policy (whose identity is attribute attr) on a lease: the region
// holds its grant.
func waitLeased(t testing.TB, a *AgentProcess, policy, attr string, limit time.Duration) {
	t.Helper()
	poll(t, limit, 50*time.Millisecond, func() error {
		probe := &pb.CheckRequest{Policy: policy, Attributes: map[string]string{attr: "probe"}}
		resp, err := a.Check.Check(t.Context(), probe)
		if err == nil && resp.Mode == "leased" {
			return nil
		}
		return fmt.Errorf("%s not leased: %v %v", a.Region, resp, err)
	})
}

// gather runs caller(g) in n goroutines, g from 0 to n-1, and returns
// every latency they return, once all have: the callers of the benchmarks'
// rounds each record their own calls' latencies.
func gather(n int, caller func(g int) []time.Duration) []time.Duration {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := caller(g)
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all
}
