package xdsserver

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
)

// Resender is a hostile ADS server on loopback: it answers every request,
// NACKs included, with the same configuration again, one its client
// refuses. Unpaced, a client and such a server loop as fast as both can
// convert.
type Resender struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	Addr  string
	bad   *anypb.Any
	nacks atomic.Int64
}

// StartResender serves bad on a loopback port until the end of t.
func StartResender(t testing.TB, bad *anypb.Any) *Resender {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Resender{Addr: lis.Addr().String(), bad: bad}
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, s)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return s
}

// NACKs is how many requests refused a configuration so far.
func (s *Resender) NACKs() int64 { return s.nacks.Load() }

// StreamAggregatedResources answers every request with the configuration.
func (s *Resender) StreamAggregatedResources(
	st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer,
) error {
	for n := 0; ; n++ {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		if req.GetErrorDetail() != nil {
			s.nacks.Add(1)
		}
		if err := st.Send(&discovery.DiscoveryResponse{VersionInfo: "bad", TypeUrl: ratelimitxds.TypeURL,
			Nonce: strings.Repeat("n", n%7+1), Resources: []*anypb.Any{s.bad}}); err != nil {
			return err
		}
	}
}
