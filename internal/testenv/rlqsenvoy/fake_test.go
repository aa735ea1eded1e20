package rlqsenvoy

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// fakeServer is a tiny RLQS server for this package's tests: it records
// what each stream receives and sends what the test tells it to.
type fakeServer struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	addr string

	mu      sync.Mutex
	streams []*fakeStream
}

type fakeStream struct {
	md   metadata.MD
	out  chan *rlqsv3.RateLimitQuotaResponse
	kill chan struct{}

	mu      sync.Mutex
	reports []*rlqsv3.RateLimitQuotaUsageReports
	ended   bool
}

func startFake(t *testing.T) *fakeServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{addr: lis.Addr().String()}
	s := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(s, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return f
}

func (f *fakeServer) StreamRateLimitQuotas(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	fs := &fakeStream{md: md, out: make(chan *rlqsv3.RateLimitQuotaResponse, 16), kill: make(chan struct{})}
	f.mu.Lock()
	f.streams = append(f.streams, fs)
	f.mu.Unlock()
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			fs.mu.Lock()
			fs.reports = append(fs.reports, r)
			fs.mu.Unlock()
		}
	}()
	defer func() { fs.mu.Lock(); fs.ended = true; fs.mu.Unlock() }()
	for {
		select {
		case r := <-fs.out:
			if err := s.Send(r); err != nil {
				return err
			}
		case <-fs.kill:
			return nil
		case <-recvDone:
			return nil
		}
	}
}

func (f *fakeServer) stream(i int) *fakeStream {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.streams) {
		return nil
	}
	return f.streams[i]
}

func (f *fakeServer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.streams)
}

func (s *fakeStream) got() []*rlqsv3.RateLimitQuotaUsageReports {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*rlqsv3.RateLimitQuotaUsageReports(nil), s.reports...)
}

// waitReports waits until stream i has received n reports and returns them.
func (f *fakeServer) waitReports(t *testing.T, i, n int) []*rlqsv3.RateLimitQuotaUsageReports {
	t.Helper()
	var got []*rlqsv3.RateLimitQuotaUsageReports
	testenv.WaitFor(t, 5*time.Second, "reports on the stream", func() bool {
		if s := f.stream(i); s != nil {
			got = s.got()
		}
		return len(got) >= n
	})
	return got
}

// newTestInstance is an instance of the fake on a manual clock whose
// report timer never fires by itself (tests call ReportNow).
func newTestInstance(t *testing.T, f *fakeServer, clk clock.Clock, set *rlqfv3.RateLimitQuotaBucketSettings) *Instance {
	t.Helper()
	cfg := testConfig(f.addr, "envoy-0", clk, time.Hour)
	cfg.Settings = set
	in, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in
}

// withBucket starts a fake server and an instance on a manual clock, and
// makes the instance's first request, of tenantA, reported at once.
func withBucket(t *testing.T, set *rlqfv3.RateLimitQuotaBucketSettings) (*fakeServer, *clock.Manual, *Instance) {
	t.Helper()
	f := startFake(t)
	clk := &clock.Manual{}
	in := newTestInstance(t, f, clk, set)
	in.Allow(tenantA)
	f.waitReports(t, 0, 1)
	return f, clk, in
}

// testConfig is an instance of domain "edge" at target, in plain text.
func testConfig(target, name string, clk clock.Clock, every time.Duration) Config {
	cfg := DefaultConfig()
	cfg.Name, cfg.Target, cfg.Domain, cfg.Clock, cfg.ReportInterval = name, target, "edge", clk, every
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	return cfg
}

// noAssignment is a no_assignment_behavior of strategy s.
func noAssignment(s *typev3.RateLimitStrategy) *rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior {
	return &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: s}}
}

// expiredFallback is an expired_assignment_behavior of strategy s for timeout.
func expiredFallback(timeout time.Duration, s *typev3.RateLimitStrategy) *rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior {
	return &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
		ExpiredAssignmentBehaviorTimeout: durationpb.New(timeout),
		ExpiredAssignmentBehavior:        &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: s}}
}

// Builders for the messages a server sends.

func tbStrategy(maxTokens, perFill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(every)}}}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func assignment(id map[string]string, s *typev3.RateLimitStrategy, ttl *durationpb.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s}}}
}

func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
}

// push sends actions on stream i and waits until the instance processed
// them.
func (f *fakeServer) push(t *testing.T, in *Instance, i int, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	before := in.Stats().Responses
	f.stream(i).out <- &rlqsv3.RateLimitQuotaResponse{BucketAction: actions}
	testenv.WaitFor(t, 5*time.Second, "the response applied", func() bool { return in.Stats().Responses > before })
}

// allowN makes n requests of id and returns how many were admitted.
func allowN(in *Instance, id map[string]string, n int) int {
	admitted := 0
	for range n {
		if in.Allow(id).Allowed {
			admitted++
		}
	}
	return admitted
}

func ttlOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func settingsWith(mut func(*rlqfv3.RateLimitQuotaBucketSettings)) *rlqfv3.RateLimitQuotaBucketSettings {
	s := &rlqfv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(time.Second)}
	mut(s)
	return s
}

func sameMsg(a, b proto.Message) bool { return proto.Equal(a, b) }
