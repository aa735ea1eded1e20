// Package rlqsfake is a tiny RLQS server for tests of RLQS clients (the
// client library and the Envoy-like test client): it records what each
// stream receives and sends what the test tells it to, with builders for
// the messages a server sends.
package rlqsfake

import (
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/quotalease"
)

// Server is a plaintext RLQS server on loopback, stopped when the test
// ends.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	// Addr is its address.
	Addr string

	mu      sync.Mutex
	streams []*Stream
	refused int  // streams refused
	refuse  bool // refuse every stream, as an agent at its most streams does
}

// Refuse makes the server refuse every stream from now on with
// ResourceExhausted, before any answer.
func (f *Server) Refuse() {
	f.mu.Lock()
	f.refuse = true
	f.mu.Unlock()
}

// Refused is how many streams the server refused.
func (f *Server) Refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// Stream is one stream the server accepted.
type Stream struct {
	// MD is the metadata the stream opened with.
	MD metadata.MD
	// Out carries what the test sends on the stream.
	Out chan *rlqsv3.RateLimitQuotaResponse
	// Kill, closed, ends the stream from the server's side.
	Kill chan struct{}

	mu      sync.Mutex
	reports []*rlqsv3.RateLimitQuotaUsageReports
	ended   bool
}

// Start starts a server.
func Start(t testing.TB) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &Server{Addr: lis.Addr().String()}
	s := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(s, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return f
}

// StreamRateLimitQuotas records the stream's reports and sends what the
// test puts in Out until the client or Kill ends it.
func (f *Server) StreamRateLimitQuotas(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	f.mu.Lock()
	if f.refuse {
		f.refused++
		f.mu.Unlock()
		return status.Error(codes.ResourceExhausted, "refused")
	}
	f.mu.Unlock()
	md, _ := metadata.FromIncomingContext(s.Context())
	fs := &Stream{MD: md, Out: make(chan *rlqsv3.RateLimitQuotaResponse, 16), Kill: make(chan struct{})}
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
		case r := <-fs.Out:
			if err := s.Send(r); err != nil {
				return err
			}
		case <-fs.Kill:
			return nil
		case <-recvDone:
			return nil
		}
	}
}

// Stream is the i-th stream the server accepted, nil before it.
func (f *Server) Stream(i int) *Stream {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.streams) {
		return nil
	}
	return f.streams[i]
}

// Count is how many streams the server accepted.
func (f *Server) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.streams)
}

// Got are the reports the stream received so far.
func (s *Stream) Got() []*rlqsv3.RateLimitQuotaUsageReports {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reports)
}

// Ended says whether the stream has ended.
func (s *Stream) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// WaitReports waits until stream i has received n reports and returns them.
func (f *Server) WaitReports(t testing.TB, i, n int) []*rlqsv3.RateLimitQuotaUsageReports {
	t.Helper()
	var got []*rlqsv3.RateLimitQuotaUsageReports
	waitFor(t, "reports on the stream", func() bool {
		if s := f.Stream(i); s != nil {
			got = s.Got()
		}
		return len(got) >= n
	})
	return got
}

// Client is what Push reads of the client the server talks to.
type Client interface{ Stats() quotalease.Stats }

// Push sends actions on stream i and waits until c applied them.
func (f *Server) Push(t testing.TB, c Client, i int, actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	t.Helper()
	before := c.Stats().Responses
	f.Stream(i).Out <- &rlqsv3.RateLimitQuotaResponse{BucketAction: actions}
	waitFor(t, "the response applied", func() bool { return c.Stats().Responses > before })
}

// waitFor polls cond until it holds, failing t after 5 s. (Package testenv
// has WaitFor, but only tests may import it.)
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 5s waiting for %s", what)
		}
	}
}

// TokenBucket is a token_bucket strategy, as the agent sends one
// (quotalease.StrategyProto).
func TokenBucket(maxTokens, perFill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return quotalease.StrategyProto(envoy.Strategy{Kind: envoy.TokenBucket,
		Bucket: envoy.TokenBucketConfig{MaxTokens: maxTokens, TokensPerFill: perFill, FillInterval: every}})
}

// Blanket is a blanket_rule strategy.
func Blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// Assignment is a quota assignment of s to the bucket id for ttl.
func Assignment(
	id map[string]string,
	s *typev3.RateLimitStrategy,
	ttl *durationpb.Duration,
) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: ttl, RateLimitStrategy: s}}}
}

// Abandon is an abandon action for the bucket id.
func Abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}
