package cluster

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// The impersonation attack, over real processes with mutual TLS: a
// caller holding region us's certificate sends Lease calls for region eu
// under eu's real instance name with fresh nonces, every 200 ms for 6 s
// (before, this marked eu's grants replaced and kept eu degraded). Every
// call is refused; eu stays leased and its checks never fall back. A
// plaintext caller is refused too, and the admin CLI works only with the
// admin certificate.
func TestE2EForgedLeaseCallsRefused(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	leader, err := c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	attacker := pb.NewLeaseServiceClient(dial(t, leader.Addr, c.pki.regions["us"]))

	refused := 0
	d := runWhile(t, c, 10*time.Second, func() {
		time.Sleep(2 * time.Second)
		for i := 0; i < 30; i++ {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := attacker.Lease(cctx, &pb.LeaseRequest{Region: "eu", Instance: "eu-1", Nonce: "forged-" + time.Now().String(),
				Quotas: []*pb.QuotaRequest{{Quota: "api-global", Demand: 1 << 50}}})
			cancel()
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("forged lease call %d: %v, want PermissionDenied", i, err)
			}
			refused++
			time.Sleep(200 * time.Millisecond)
		}
	}, steady("api-global", "api", 1, 0, map[string]float64{"us": 20, "eu": 20, "ap": 20}))
	st := d.Stats("api-global")["eu"]
	t.Logf("%d forged calls refused; eu: %s", refused, st.Describe())
	if st.Modes["degraded"] > 0 || st.Modes["leased"] == 0 {
		t.Fatalf("the forged calls disturbed eu: %s", st.Describe())
	}
	noErrors(t, d, "api-global")

	plain := dial(t, leader.Addr, mtls.Files{})
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := pb.NewAdminServiceClient(plain).ListPolicies(cctx, &pb.ListPoliciesRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext admin call: %v, want the connection refused", err)
	}

	cli := func(env ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bins.Coordinator, "quota", "list", "--coordinator", leader.Addr)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	admin := c.pki.admin
	if out, err := cli("QUOTALEASE_TLS_CA="+admin.CA, "QUOTALEASE_TLS_CERT="+admin.Cert, "QUOTALEASE_TLS_KEY="+admin.Key); err != nil || !strings.Contains(out, "api-global") {
		t.Fatalf("admin CLI with the admin certificate: %v\n%s", err, out)
	}
	us := c.pki.regions["us"]
	if out, err := cli("QUOTALEASE_TLS_CA="+us.CA, "QUOTALEASE_TLS_CERT="+us.Cert, "QUOTALEASE_TLS_KEY="+us.Key); err != nil {
		t.Fatalf("a region's certificate cannot list policies (agents load them so): %v\n%s", err, out)
	}
	if out, err := cli(); err == nil {
		t.Fatalf("admin CLI without TLS succeeded:\n%s", out)
	} else {
		t.Logf("without certificates the CLI says: %s", strings.TrimSpace(out))
	}
}

// Every certificate of the deployment (coordinators, agents, admin,
// service) is replaced in place while traffic flows: no check fails, and
// a new connection to an agent is served the new certificate.
func TestE2ECertificateRotationUnderLoad(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	serial := func() string {
		cfg, err := clientTLS(c.pki.service)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tls.Dial("tcp", c.Agents[0].Addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serial()
	d := runWhile(t, c, 8*time.Second, func() {
		time.Sleep(3 * time.Second)
		if err := c.Rotate(); err != nil {
			t.Fatal(err)
		}
	}, steady("api-global", "api", 1, 0, map[string]float64{"us": 30, "eu": 30, "ap": 30}))
	noErrors(t, d, "api-global")
	after := serial()
	for i := 0; after == before && i < 50; i++ { // re-read within a second
		time.Sleep(100 * time.Millisecond)
		after = serial()
	}
	if after == before {
		t.Fatal("the agent still serves the old certificate after rotation")
	}
	if _, err := c.Leases(ctx); err != nil {
		t.Fatalf("admin call after rotation: %v", err)
	}
}
