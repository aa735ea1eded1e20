package ratelimitxds_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
)

// resender is an ADS server that answers every request, NACKs included,
// with the same configuration again, which the client refuses.
type resender struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	bad   *anypb.Any
	nacks atomic.Int64
}

func (s *resender) StreamAggregatedResources(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for n := 0; ; n++ {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		if req.GetErrorDetail() != nil {
			s.nacks.Add(1)
		}
		if err := st.Send(&discovery.DiscoveryResponse{VersionInfo: "bad", TypeUrl: ratelimitxds.TypeURL, Nonce: strings.Repeat("n", n%7+1),
			Resources: []*anypb.Any{s.bad}}); err != nil {
			return err
		}
	}
}

// logLines counts the warnings a logger was given.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logLines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// A management server that sends a rejected configuration again after
// every NACK is NACKed at a pace that halves as it goes on (backoff up to
// its most, here 200 ms), not as fast as both can go, and the repeated
// rejection is logged at the 1st, 2nd, 4th, 8th ... repetition only.
func TestNacksArePaced(t *testing.T) {
	bad := perMinute("b", 10)
	bad.Descriptors[0].RateLimit.RequestsPerUnit = 0
	bad.Descriptors[0].RateLimit.Unit = 0
	res, err := anypb.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	srv := &resender{bad: res}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	var logs logLines
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	r := &recorder{}
	cl, err := ratelimitxds.NewClient(*xdsserver.Settings(lis.Addr().String(), nil), r.apply, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { cl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	testenv.WaitFor(t, 10*time.Second, "ten NACKs", func() bool { return srv.nacks.Load() >= 10 })
	began, before := time.Now(), srv.nacks.Load()
	testenv.WaitFor(t, 10*time.Second, "ten more NACKs", func() bool { return srv.nacks.Load() >= before+10 })
	// At the most backoff (200 ms) ten NACKs take about 2 s; unpaced, a
	// loopback server and client make thousands a second.
	if took := time.Since(began); took < 10*100*time.Millisecond {
		t.Errorf("ten NACKs of the same rejection within %v: not paced", took)
	}
	if n := logs.count(); n > 8 {
		t.Errorf("%d log lines for %d NACKs of one rejection; want one at each power of two: %v", n, srv.nacks.Load(), logs.lines)
	}
	if _, n := r.last(); n != 0 {
		t.Errorf("a rejected configuration was applied %d times", n)
	}
}
