// Package xdsserver runs a real xDS management server on loopback for
// tests: go-control-plane's state-of-the-world server over its snapshot
// cache, serving envoyproxy/ratelimit's RateLimitConfig resources over ADS
// as Envoy Gateway serves them to envoyproxy/ratelimit. It records what
// its client acknowledged and refused.
package xdsserver

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
)

// Server is a running management server.
type Server struct {
	Addr  string
	node  string
	cache cachev3.SnapshotCache
	srv   *grpc.Server
	stop  func()

	mu      sync.Mutex
	sent    map[string]string // nonce -> version sent with it
	acks    []string          // versions acknowledged, in order
	nacks   map[string]string // version -> error detail of its NACK
	streams int
}

// Start serves on addr ("" for a free loopback port) to node, over TLS
// when tc is not nil; Stop (also at the test's end) stops it.
func Start(t testing.TB, addr, node string, tc *tls.Config) *Server {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; { // a restart on the same port may wait for it to be free
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: lis.Addr().String(), node: node, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		sent: map[string]string{}, nacks: map[string]string{}}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.srv = grpc.NewServer(opts...)
	ctx, cancel := context.WithCancel(context.Background())
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			s.streams++
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			switch v, answered := s.sent[req.GetResponseNonce()]; {
			case !answered:
			case req.GetErrorDetail() != nil:
				s.nacks[v] = req.GetErrorDetail().GetMessage()
			default:
				s.acks = append(s.acks, req.GetVersionInfo())
			}
			return nil
		},
		StreamResponseFunc: func(
			_ context.Context,
			_ int64,
			_ *discovery.DiscoveryRequest,
			resp *discovery.DiscoveryResponse,
		) {
			s.mu.Lock()
			s.sent[resp.GetNonce()] = resp.GetVersionInfo()
			s.mu.Unlock()
		},
	}
	discovery.RegisterAggregatedDiscoveryServiceServer(s.srv, serverv3.NewServer(ctx, s.cache, cb))
	go s.srv.Serve(lis)
	var once sync.Once
	s.stop = func() { once.Do(func() { s.srv.Stop(); cancel() }) }
	t.Cleanup(s.stop)
	return s
}

// Stop stops serving: every stream ends, as when the server goes away.
func (s *Server) Stop() { s.stop() }

// Set serves cfgs as version to the node.
func (s *Server) Set(t testing.TB, version string, cfgs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), s.node, snap); err != nil {
		t.Fatal(err)
	}
}

// Acked reports whether version was acknowledged.
func (s *Server) Acked(version string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.acks {
		if v == version {
			return true
		}
	}
	return false
}

// Nacked returns the error detail version was refused with, if it was.
func (s *Server) Nacked(version string) (detail string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	detail, ok = s.nacks[version]
	return detail, ok
}

// Streams is how many streams were opened.
func (s *Server) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// TLS makes a throwaway CA, a server TLS configuration requiring client
// certificates it signed, and a client one presenting such a certificate:
// how Envoy Gateway secures its rate limit xDS server.
func TLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca, err := devca.New(t.TempDir(), "xds")
	if err != nil {
		t.Fatal(err)
	}
	sc, sk, err := ca.Issue(devca.Leaf{Name: "envoy-gateway"})
	if err != nil {
		t.Fatal(err)
	}
	cc, ck, err := ca.Issue(devca.Leaf{Name: "coordinator"})
	if err != nil {
		t.Fatal(err)
	}
	if server, err = mtls.Server(mtls.Files{Cert: sc, Key: sk, CA: ca.CertFile}); err != nil {
		t.Fatal(err)
	}
	if client, err = mtls.Client(mtls.Files{Cert: cc, Key: ck, CA: ca.CertFile}, ""); err != nil {
		t.Fatal(err)
	}
	return server, client
}

// Settings are a client's settings for the server at addr with tc (nil:
// plaintext), backing off briefly as tests want.
func Settings(addr string, tc *tls.Config) *ratelimitxds.Settings {
	return &ratelimitxds.Settings{
		Server:          addr,
		NodeID:          ratelimitxds.DefaultNodeID,
		TLS:             tc,
		MaxMessageBytes: ratelimitxds.DefaultMaxMessageBytes,
		MinBackoff:      20 * time.Millisecond,
		MaxBackoff:      200 * time.Millisecond,
	}
}
