package agent

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// tlsGRPC serves ra's gRPC API over mutual TLS 1.3 with certificates of a
// throwaway CA, until the end of t, and returns a function that dials it
// as a caller presenting a certificate of its own, named name.
func tlsGRPC(t testing.TB, ra *runningAgent) (dialAs func(name string) *grpc.ClientConn) {
	t.Helper()
	ca, err := devca.New(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string) mtls.Files {
		cert, key, err := ca.Issue(devca.Leaf{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return mtls.Files{Cert: cert, Key: key, CA: ca.CertFile}
	}
	srv, err := mtls.Server(issue("agent"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(checkapi.GRPCServerOptions(), grpc.Creds(credentials.NewTLS(srv)))...)
	ra.a.RegisterGRPC(gs)
	go gs.Serve(l)
	t.Cleanup(gs.Stop)
	return func(name string) *grpc.ClientConn {
		cli, err := mtls.Client(issue(name), "localhost")
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cli)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}
