// Package impostor serves a fake coordinator over TLS on loopback, for
// tests that a client accepts a coordinator only by its identity: given an
// agent's or a service's certificate from the deployment's CA, it passes
// the chain and host name checks, and answers every admin and lease call
// as a coordinator would, so a client that does not check the identity
// visibly trusts it.
package impostor

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/internal/mtls"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Server is a running impostor.
type Server struct {
	pb.UnimplementedLeaseServiceServer
	pb.UnimplementedAdminServiceServer
	// Addr is its host:port on loopback.
	Addr string
	// Answered counts the calls it answered: a client that refused it by
	// identity never gets that far.
	Answered atomic.Int64
}

// Start serves an impostor with f's certificate (f.CA, when set, verifies
// client certificates) until the test ends.
func Start(t testing.TB, f mtls.Files) *Server {
	t.Helper()
	cfg, err := mtls.ServerOptionalClient(f)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: lis.Addr().String()}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	pb.RegisterAdminServiceServer(srv, s)
	pb.RegisterLeaseServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s
}

// SetPolicy claims to store the policies it is given (it keeps nothing),
// as the impostor did with 100 of them.
func (s *Server) SetPolicy(_ context.Context, req *pb.SetPolicyRequest) (*pb.SetPolicyResponse, error) {
	s.Answered.Add(1)
	return &pb.SetPolicyResponse{Policies: []*pb.PolicyRecord{{Name: "stored-by-impostor", Version: 1}}}, nil
}

// Lease grants every quota asked for in full.
func (s *Server) Lease(_ context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	s.Answered.Add(1)
	resp := &pb.LeaseResponse{Epoch: 1}
	for _, q := range req.Quotas {
		resp.Grants = append(resp.Grants, &pb.QuotaGrant{
			Quota:      q.Quota,
			GrantId:    "1.1",
			Rate:       1 << 40,
			Burst:      1 << 40,
			ValidForMs: 60_000,
		})
	}
	return resp, nil
}
