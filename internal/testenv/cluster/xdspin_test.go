package cluster

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A coordinator process subscribes over mutual TLS, with the deployment's
// own CA, to the xDS management server it names by SPIFFE ID, as the
// runbook deploys it. A server presenting another certificate of that CA
// (a plain service certificate, valid for the host) is refused before a
// stream opens, and nothing it serves is stored; once the named server
// answers at the same address, its configuration is stored.
func TestXDSServerIdentityPinned(t *testing.T) {
	testenv.SkipMultiProcess(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	const id = "spiffe://" + TrustDomain + "/role/xds"
	dir := t.TempDir()
	coord := pkiFiles(dir, "coordinator")
	c := startIn(t, dir, globalPolicy, Options{Regions: []string{"us"}, Coordinators: 1,
		CoordinatorArgs: []string{"--ratelimit-xds", addr, "--ratelimit-xds-tls-ca", coord.CA,
			"--ratelimit-xds-tls-cert", coord.Cert, "--ratelimit-xds-tls-key", coord.Key, "--ratelimit-xds-server-id", id}})
	if c.pki.files["coordinator"] != coord {
		t.Fatalf("the cluster's coordinator certificate is %+v, the flags named %+v", c.pki.files["coordinator"], coord)
	}
	serve := func(f mtls.Files, domain string) *xdsserver.Server {
		tc, err := mtls.Server(f)
		if err != nil {
			t.Fatal(err)
		}
		srv := xdsserver.Start(t, addr, "envoy-ratelimit", tc)
		srv.Set(t, "1", &rlsconf.RateLimitConfig{Name: domain + "-listener", Domain: domain,
			Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "user",
				RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 10}}}})
		return srv
	}
	stored := func(name string) (bool, error) {
		err := c.Admin(t.Context(), func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
			_, err := a.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: name}, opts...)
			return err
		})
		if status.Code(err) == codes.NotFound {
			return false, nil
		}
		return err == nil, err
	}

	impostor := serve(c.pki.service, "impostor")
	log := filepath.Join(dir, "coordinator-1.log")
	testenv.WaitFor(t, 30*time.Second, "the impostor refused or served", func() bool {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "does not name "+id) || impostor.Streams() > 0
	})
	impostor.Stop()
	if n := impostor.Streams(); n > 0 {
		t.Errorf("the impostor served %d streams, want none: refused in the handshake", n)
	}
	if ok, err := stored("impostor.user"); ok || err != nil {
		t.Errorf("the impostor's policy stored: %t, %v", ok, err)
	}

	genuine, err := c.pki.issue("xds", &caller.ID{Kind: caller.Role, Name: "xds"})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(genuine, "edge")
	testenv.WaitFor(t, 60*time.Second, "the named server's configuration acknowledged", func() bool { return srv.Acked("1") })
	if ok, err := stored("edge.user"); !ok || err != nil {
		t.Errorf("the named server's policy stored: %t, %v", ok, err)
	}
}

// pkiFiles are the files Start issues certificate name as in dir, the
// cluster's directory, for flags that name them before it starts.
func pkiFiles(dir, name string) mtls.Files {
	d := filepath.Join(dir, "pki")
	return mtls.Files{Cert: filepath.Join(d, name+".pem"), Key: filepath.Join(d, name+"-key.pem"), CA: filepath.Join(d, "cluster-ca.pem")}
}
