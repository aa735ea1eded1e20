package coordinator

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// One Lease call naming a live agent's instance with a new nonce, sent
// with the region's own certificate, used to evict that agent: the book
// took the newest nonce as a restart, and refused the live agent as a
// duplicate ten times a second until the coordinator restarted, while
// `leases` showed it degraded and expired. Over real gRPC and TLS: the
// live agent keeps its name and its lease, the newcomer is refused with
// how long to wait, and gets the name only once the live agent's grants
// have ended. A per-instance certificate can lease only as its instance.
func TestLiveInstanceKeepsName(t *testing.T) {
	p := newPKI(t)
	p.issue(t, "us-b", caller.ID{Kind: caller.Region, Name: "us", Instance: "us-b"}, time.Time{})
	r := startSecure(t, p)
	ctx := t.Context()
	adm, _ := dialAs(t, p, r, "admin")
	setPolicy(t, adm, policy100)
	live := newTestAgent(t, leaseClientAs(t, p, r, "us"), "us", "api", 100*M)
	live.instance = "us-a"
	if err := live.renew(ctx); err != nil {
		t.Fatal(err)
	}

	intruder := newTestAgent(t, leaseClientAs(t, p, r, "us"), "us", "api", 100*M)
	intruder.instance, intruder.nonce = "us-a", "forged-nonce"
	err := intruder.renew(ctx)
	wait, held := leaseapi.InstanceHeld(err, 0)
	if !held || code(err) != codes.AlreadyExists || wait <= 0 || wait > testTiming.ValidFor {
		t.Fatalf("a new nonce for a live instance: %v (retry in %v), want AlreadyExists with a delay within a lease", err, wait)
	}
	for _, want := range []string{`"us-a"`, "held by another agent process", "--instance", "certs issue"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if err := live.renew(ctx); err != nil {
		t.Fatalf("the live agent was refused after a forged call: %v", err)
	}
	if amt, mode := live.enforcing(); mode != "leased" || amt <= 0 {
		t.Fatalf("the live agent enforces %d in mode %s", amt, mode)
	}
	rec := leaseOf(t, adm, "api", "us")
	if rec.Instance != "us-a" || rec.State != "active" || rec.ExpiresInMs <= 0 {
		t.Fatalf("leases shows %s %s expiring in %d ms, want us-a active", rec.Instance, rec.State, rec.ExpiresInMs)
	}

	// A per-instance certificate leases as its own instance, never as
	// another one.
	b := newTestAgent(t, leaseClientAs(t, p, r, "us-b"), "us", "api", 100*M)
	b.instance = "us-b"
	if err := b.renew(ctx); err != nil {
		t.Fatalf("us-b with its own certificate: %v", err)
	}
	b.instance = "us-a"
	if err := b.renew(ctx); code(err) != codes.PermissionDenied {
		t.Fatalf("us-b's certificate leased as us-a: %v", err)
	}

	// The live agent stops (a restart): once its grants have ended, the
	// new process gets the name.
	testenv.WaitFor(t, 3*testTiming.ValidFor, "the name to be free once the old grants ended", func() bool {
		return intruder.renew(ctx) == nil
	})
	if err := live.renew(ctx); code(err) != codes.AlreadyExists {
		t.Fatalf("the old process came back after its grants ended and took the name back: %v", err)
	}
}

// leaseClientAs is a lease client of r presenting the certificate name.
func leaseClientAs(t testing.TB, p *pki, r *replica, name string) *leaseapi.Client {
	t.Helper()
	cfg := clientTLS(t, p.files[name], "localhost")
	cl, err := leaseapi.NewClient([]string{r.addr})
	if err != nil {
		t.Fatal(err)
	}
	cl.UseTLS(cfg)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// leaseOf is the admin API's record of region's lease on quota.
func leaseOf(t testing.TB, adm pb.AdminServiceClient, quota, region string) *pb.LeaseRecord {
	t.Helper()
	resp, err := adm.ListLeases(t.Context(), &pb.ListLeasesRequest{Region: region})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range resp.Leases {
		if l.Quota == quota && l.Region == region {
			return l
		}
	}
	t.Fatalf("no lease of %s in %s: %v", quota, region, resp.Leases)
	return nil
}
