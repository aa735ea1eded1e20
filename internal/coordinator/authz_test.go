package coordinator

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

const trustDomain = "quota-lease.test"

// pki is a throwaway CA with the certificates the tests hand out.
type pki struct {
	ca    *devca.CA
	files map[string]mtls.Files // by name: server, us, eu, admin, viewer, ...
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := devca.New(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca, files: map[string]mtls.Files{}}
	for name, id := range map[string]caller.ID{
		"server": {Kind: caller.Role, Name: "server"}, // names no usable identity
		"us":     {Kind: caller.Region, Name: "us"},
		"eu":     {Kind: caller.Region, Name: "eu"},
		"ap":     {Kind: caller.Region, Name: "ap"},
		"admin":  {Kind: caller.Role, Name: caller.Admin},
		"viewer": {Kind: caller.Role, Name: caller.Viewer},
	} {
		p.issue(t, name, id, time.Time{})
	}
	return p
}

func (p *pki) issue(t testing.TB, name string, id caller.ID, notAfter time.Time) mtls.Files {
	t.Helper()
	cert, key, err := p.ca.Issue(devca.Leaf{Name: name, URIs: []*url.URL{caller.URI(trustDomain, id)}, NotAfter: notAfter})
	if err != nil {
		t.Fatal(err)
	}
	f := mtls.Files{Cert: cert, Key: key, CA: p.ca.CertFile}
	p.files[name] = f
	return f
}

// startSecure starts a replica serving mutual TLS with authorization on.
func startSecure(t testing.TB, p *pki, mods ...func(*Config)) *replica {
	t.Helper()
	sf := p.files["server"]
	cfg, err := mtls.Server(sf)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, testenv.Prefix(t), "secure", func(c *Config) {
		c.TrustDomain = trustDomain
		for _, m := range mods {
			m(c)
		}
	}, grpc.Creds(credentials.NewTLS(cfg)))
	waitLeader(t, r)
	return r
}

// dialAs connects to r with the certificate of name ("" for none).
func dialAs(t testing.TB, p *pki, r *replica, name string) (pb.AdminServiceClient, pb.LeaseServiceClient) {
	t.Helper()
	f := mtls.Files{CA: p.ca.CertFile}
	if name != "" {
		f = p.files[name]
	}
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, f, "localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewAdminServiceClient(cc), pb.NewLeaseServiceClient(cc)
}

func code(err error) codes.Code { return status.Code(err) }

// clientTLS is the client side of mutual TLS with the certificate files f,
// for a server that must be named serverName; files that do not load fail
// t.
func clientTLS(t testing.TB, f mtls.Files, serverName string) *tls.Config {
	t.Helper()
	cfg, err := mtls.Client(f, serverName)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestAdminNeedsRole(t *testing.T) {
	p := newPKI(t)
	r := startSecure(t, p)
	ctx := t.Context()
	set := &pb.SetPolicyRequest{Yaml: "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n"}

	adm, _ := dialAs(t, p, r, "admin")
	if _, err := adm.SetPolicy(ctx, set); err != nil {
		t.Fatalf("admin cannot set a policy: %v", err)
	}
	view, _ := dialAs(t, p, r, "viewer")
	if _, err := view.ListPolicies(ctx, &pb.ListPoliciesRequest{}); err != nil {
		t.Fatalf("viewer cannot list: %v", err)
	}
	if _, err := view.SetPolicy(ctx, set); code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "needs role admin") {
		t.Fatalf("viewer set a policy: %v, want PermissionDenied", err)
	}
	for _, op := range []func() error{
		func() error { _, err := view.DeletePolicy(ctx, &pb.DeletePolicyRequest{Name: "api"}); return err },
		func() error { _, err := view.ReleaseRegion(ctx, &pb.ReleaseRegionRequest{Region: "us"}); return err },
		func() error { _, err := view.Rebalance(ctx, &pb.RebalanceRequest{}); return err },
	} {
		if err := op(); code(err) != codes.PermissionDenied {
			t.Fatalf("viewer changed state: %v", err)
		}
	}
	us, _ := dialAs(t, p, r, "us")
	if _, err := us.ListLeases(ctx, &pb.ListLeasesRequest{}); code(err) != codes.PermissionDenied {
		t.Fatalf("a region's certificate read the leases: %v", err)
	}
	if _, err := us.ListPolicies(ctx, &pb.ListPoliciesRequest{}); err != nil {
		t.Fatalf("a region's agent cannot load its policies: %v", err)
	}
	if _, err := us.SetPolicy(ctx, set); code(err) != codes.PermissionDenied {
		t.Fatalf("a region's certificate set a policy: %v", err)
	}
	if _, err := adm.GetPolicy(ctx, &pb.GetPolicyRequest{Name: "api"}); err != nil {
		t.Fatalf("the viewer's refused writes changed the policy: %v", err)
	}
	// The coordinators' own identity is a server's: it calls nothing.
	p.issue(t, "coordinator", caller.CoordinatorID, time.Time{})
	co, coLease := dialAs(t, p, r, "coordinator")
	if _, err := co.ListPolicies(ctx, &pb.ListPoliciesRequest{}); code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "calls nothing") {
		t.Fatalf("the coordinator identity listed policies: %v", err)
	}
	if _, err := co.ListLeases(ctx, &pb.ListLeasesRequest{}); code(err) != codes.PermissionDenied {
		t.Fatalf("the coordinator identity read the leases: %v", err)
	}
	if _, err := coLease.Lease(ctx, &pb.LeaseRequest{Region: "us", Instance: "i", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api"}}}); code(err) != codes.PermissionDenied {
		t.Fatalf("the coordinator identity leased: %v", err)
	}
	if n := refusedCount(r.c); n < 8 {
		t.Fatalf("%d refusals counted, want at least 8", n)
	}
}

func refusedCount(c *Coordinator) int64 {
	var n int64
	c.refused.m.Range(func(_, v any) bool { n += v.(interface{ Load() int64 }).Load(); return true })
	return n
}

// A certificate of region us asking for region eu's lease is refused
// before anything is booked: eu's leases stay as they were.
func TestLeaseOnlyForOwnRegion(t *testing.T) {
	p := newPKI(t)
	r := startSecure(t, p)
	ctx := t.Context()
	adm, _ := dialAs(t, p, r, "admin")
	setPolicy(t, adm, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	_, us := dialAs(t, p, r, "us")
	req := func(region string) *pb.LeaseRequest {
		return &pb.LeaseRequest{Region: region, Instance: region + "-1", Nonce: "n-" + region, Quotas: []*pb.QuotaRequest{{Quota: "api", Demand: 1 << 50}}}
	}
	if _, err := us.Lease(ctx, req("us")); err != nil {
		t.Fatalf("region us cannot lease for itself: %v", err)
	}
	before, err := adm.ListLeases(ctx, &pb.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = us.Lease(ctx, req("eu"))
	if code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `only for "us"`) {
		t.Fatalf("us leased for eu: %v, want PermissionDenied", err)
	}
	after, err := adm.ListLeases(ctx, &pb.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range after.Leases {
		if l.Region == "eu" && l.Rate != 0 {
			t.Fatalf("a refused call booked eu: %+v", l)
		}
	}
	if len(after.Leases) != len(before.Leases) {
		t.Fatalf("leases %d before the refused call, %d after", len(before.Leases), len(after.Leases))
	}
	_, adminLease := dialAs(t, p, r, "admin")
	if _, err := adminLease.Lease(ctx, req("us")); code(err) != codes.PermissionDenied {
		t.Fatalf("an admin certificate leased: %v", err)
	}
	// A certificate of one instance leases only as that instance: it
	// cannot replace another instance's grants with a new nonce.
	p.issue(t, "us-a", caller.ID{Kind: caller.Region, Name: "us", Instance: "us-a"}, time.Time{})
	_, inst := dialAs(t, p, r, "us-a")
	own := &pb.LeaseRequest{Region: "us", Instance: "us-a", Nonce: "a", Quotas: []*pb.QuotaRequest{{Quota: "api", Demand: 1}}}
	if _, err := inst.Lease(ctx, own); err != nil {
		t.Fatalf("instance us-a leasing as itself: %v", err)
	}
	other := &pb.LeaseRequest{Region: "us", Instance: "us-1", Nonce: "hijack", Quotas: []*pb.QuotaRequest{{Quota: "api", Demand: 1}}}
	if _, err := inst.Lease(ctx, other); code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "instance") {
		t.Fatalf("instance us-a leasing as us-1: %v, want PermissionDenied", err)
	}
}

// Connections that cannot prove an identity of this CA never reach a
// handler: no certificate, another CA's, an expired one, plaintext.
func TestUntrustedCallersRefused(t *testing.T) {
	p := newPKI(t)
	r := startSecure(t, p)
	other := newPKI(t)
	expired := p.issue(t, "expired", caller.ID{Kind: caller.Role, Name: caller.Admin}, time.Now().Add(-time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	try := func(name string, creds credentials.TransportCredentials) error {
		cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		_, err = pb.NewAdminServiceClient(cc).ListPolicies(ctx, &pb.ListPoliciesRequest{})
		if err == nil {
			t.Fatalf("%s: call succeeded", name)
		}
		return err
	}
	tlsAs := func(f mtls.Files) credentials.TransportCredentials {
		f.CA = p.ca.CertFile // trust the server
		return credentials.NewTLS(clientTLS(t, f, "localhost"))
	}
	cases := map[string]credentials.TransportCredentials{
		"no certificate":     tlsAs(mtls.Files{}),
		"another CA's admin": tlsAs(other.files["admin"]),
		"expired admin":      tlsAs(expired),
		"plaintext":          insecure.NewCredentials(),
	}
	for name, creds := range cases {
		err := try(name, creds)
		if c := code(err); c != codes.Unavailable && c != codes.Unauthenticated {
			t.Errorf("%s: %v, want the connection refused", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// And a client that does not trust the server's CA refuses it.
	admin := p.files["admin"]
	cfg := clientTLS(t, mtls.Files{CA: other.ca.CertFile, Cert: admin.Cert, Key: admin.Key}, "localhost")
	if err := try("server of an unknown CA", credentials.NewTLS(cfg)); !strings.Contains(err.Error(), "certificate") {
		t.Errorf("client accepted an unknown server CA: %v", err)
	}
	// Nor a server whose certificate does not name what was dialed.
	cfg = clientTLS(t, p.files["admin"], "not-the-coordinator.example")
	if err := try("server under another name", credentials.NewTLS(cfg)); !strings.Contains(err.Error(), "not-the-coordinator.example") {
		t.Errorf("client accepted a server certificate for another name: %v", err)
	}
}

// Replacing the server's certificate files is picked up by new
// connections without a restart; connections already open keep working.
func TestServerCertificateRotation(t *testing.T) {
	p := newPKI(t)
	r := startSecure(t, p)
	adm, _ := dialAs(t, p, r, "admin")
	if _, err := adm.ListPolicies(t.Context(), &pb.ListPoliciesRequest{}); err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		conn, err := tls.Dial("tcp", r.addr, clientTLS(t, p.files["admin"], "localhost"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	old := serial()
	p.issue(t, "server", caller.ID{Kind: caller.Role, Name: "server"}, time.Time{}) // same files, new certificate
	deadline := time.Now().Add(5 * time.Second)
	for serial() == old {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was not served within 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := adm.ListPolicies(t.Context(), &pb.ListPoliciesRequest{}); err != nil {
		t.Fatalf("open connection failed after rotation: %v", err)
	}
}

// A region flooding Lease calls with fresh instance names and nonces (the
// nonce-flood attack, now only possible with the region's own certificate;
// a fresh nonce under a live name is refused anyway: TestLiveInstanceKeepsName)
// is refused past its call rate before anything is booked, and other
// regions are unaffected.
// An inflated demand is capped at the whole quota.
func TestLeaseCallsLimitedPerRegion(t *testing.T) {
	p := newPKI(t)
	r := startSecure(t, p, func(c *Config) { c.LeaseCallRate = 10 })
	ctx := t.Context()
	adm, _ := dialAs(t, p, r, "admin")
	setPolicy(t, adm, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	_, us := dialAs(t, p, r, "us")
	_, eu := dialAs(t, p, r, "eu")
	lease := func(cl pb.LeaseServiceClient, region, nonce string, demand int64) error {
		_, err := cl.Lease(ctx, &pb.LeaseRequest{Region: region, Instance: nonce, Nonce: nonce,
			Quotas: []*pb.QuotaRequest{{Quota: "api", Demand: demand}}})
		return err
	}
	ok, limited := 0, 0
	start := time.Now()
	for i := 0; i < 200; i++ {
		switch err := lease(us, "us", fmt.Sprint("flood-", i), 1<<50); code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			limited++
		default:
			t.Fatalf("flood call %d: %v", i, err)
		}
	}
	allowed := 21 + int(10*time.Since(start).Seconds()) + 1 // burst plus refill
	if ok > allowed || limited == 0 {
		t.Fatalf("%d flood calls passed, %d limited; at most %d may pass", ok, limited, allowed)
	}
	if err := lease(eu, "eu", "eu-nonce", 1); err != nil {
		t.Fatalf("eu's renewal during us's flood: %v", err)
	}
	leases, err := adm.ListLeases(ctx, &pb.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		if l.Region == "us" && l.Demand > 100*1_000_000 {
			t.Fatalf("us's demand %d not capped at the quota", l.Demand)
		}
	}
	t.Logf("flood: %d passed, %d limited", ok, limited)
}
