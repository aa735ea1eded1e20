package coordinator

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// edgeConfig is domain edge: a limit per user, and a named one per IP
// (unlimited when ipUnlimited).
func edgeConfig(perUser uint32, ipUnlimited bool) *rlsconf.RateLimitConfig {
	ip := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 100, Name: "per-ip"}
	if ipUnlimited {
		ip = &rlsconf.RateLimitPolicy{Unlimited: true, Name: "per-ip"}
	}
	return &rlsconf.RateLimitConfig{Name: "edge-listener", Domain: "edge", Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: "user", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: perUser}},
		{Key: "remote_address", RateLimit: ip},
	}}
}

func storedPolicy(t *testing.T, adm pb.AdminServiceClient, name string) (*policy.Policy, error) {
	t.Helper()
	rec, err := adm.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: name})
	if err != nil {
		return nil, err
	}
	var p policy.Policy
	if err := json.Unmarshal([]byte(rec.Json), &p); err != nil {
		t.Fatal(err)
	}
	return &p, nil
}

func storedSource(t *testing.T, r *replica, prefix, name string) *policySource {
	t.Helper()
	resp, err := r.cli.Get(t.Context(), keys{prefix}.source(name))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	src, err := loadSource(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// waitAcked waits until srv has seen the leader acknowledge (apply) the
// state it serves as version: the step between an xDS update and its checks.
func waitAcked(t *testing.T, srv *xdsserver.Server, version string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "version "+version+" ACKed", func() bool { return srv.Acked(version) })
}

// The leader stores what an xDS management server serves (over mutual
// TLS) as policies marked with their source; an SRE cannot change or
// delete them by hand while it subscribes, nor can the server take over a
// policy set by hand (NACKed, nothing stored); an update changes the
// limit, a limit that turns unlimited is replaced, and one the server no
// longer sends is deleted; the same state sent again writes nothing, and a
// new leader subscribes afresh without rewriting it either.
func TestXDSPoliciesStored(t *testing.T) {
	stls, ctls := xdsserver.TLS(t)
	srv := xdsserver.Start(t, "", "envoy-ratelimit", stls)
	srv.Set(t, "1", edgeConfig(10, false))
	prefix := testenv.Prefix(t)
	withXDS := func(c *Config) { c.RateLimitXDS = xdsserver.Settings(srv.Addr, ctls) }
	a, adm, _ := startLeader(t, prefix, "a", withXDS)
	waitAcked(t, srv, "1")
	p, err := storedPolicy(t, adm, "edge.user")
	if err != nil || p.Limit != 10 || p.Envoy == nil || p.Envoy.Domain != "edge" {
		t.Fatalf("edge.user: %+v, %v", p, err)
	}
	if src := storedSource(t, a, prefix, "edge.user"); src == nil || src.Source != sourceXDS || src.Resource != "edge-listener" || src.Version != "1" || src.Node != "envoy-ratelimit" {
		t.Fatalf("source of edge.user: %+v", src)
	}

	// By hand: refused, with where to change it.
	_, err = adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 99}\n"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "managed by xDS server") {
		t.Fatalf("quota set over an xDS policy: %v", err)
	}
	if _, err := adm.DeletePolicy(t.Context(), &pb.DeletePolicyRequest{Name: "per-ip"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("quota delete of an xDS policy: %v", err)
	}

	// The server may not take over a policy set by hand: NACKed whole.
	setPolicy(t, adm, "name: mine\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	takeover := edgeConfig(50, false)
	takeover.Descriptors = append(takeover.Descriptors, &rlsconf.RateLimitDescriptor{Key: "tenant",
		RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 5, Name: "mine"}})
	srv.Set(t, "2", takeover)
	testenv.WaitFor(t, 10*time.Second, "version 2 NACKed", func() bool { _, ok := srv.Nacked("2"); return ok })
	if detail, _ := srv.Nacked("2"); !strings.Contains(detail, `policy "mine" was set by hand`) {
		t.Fatalf("NACK detail %q", detail)
	}
	if p, _ := storedPolicy(t, adm, "edge.user"); p.Limit != 10 {
		t.Fatalf("a NACKed response changed edge.user to %v", p.Limit)
	}
	if p, _ := storedPolicy(t, adm, "mine"); p.Envoy != nil || p.Limit != 100 {
		t.Fatalf("a NACKed response changed the hand-set policy: %+v", p)
	}

	// An update: the limit changes, and per-ip turns unlimited (region
	// scope: deleted and recreated, its grants reserved).
	srv.Set(t, "3", edgeConfig(20, true))
	waitAcked(t, srv, "3")
	if p, _ := storedPolicy(t, adm, "edge.user"); p.Limit != 20 {
		t.Fatalf("edge.user limit %v after the update", p.Limit)
	}
	if p, _ := storedPolicy(t, adm, "per-ip"); !p.Envoy.Unlimited || p.Scope != policy.ScopeRegion {
		t.Fatalf("per-ip after it turned unlimited: %+v", p)
	}
	if src := storedSource(t, a, prefix, "edge.user"); src.Version != "3" {
		t.Fatalf("source version %q after version 3", src.Version)
	}
	if rec, err := adm.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: "edge.user"}); err != nil || !strings.Contains(rec.Source, "xDS server "+srv.Addr) || !strings.Contains(rec.Source, `version "3"`) {
		t.Fatalf("quota get's source: %v, %v", rec, err)
	}
	list, err := adm.ListPolicies(t.Context(), &pb.ListPoliciesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range list.Policies {
		if (rec.Name == "mine") != (rec.Source == "") {
			t.Errorf("quota list: policy %s has source %q", rec.Name, rec.Source)
		}
	}

	// The same state again: acknowledged, nothing written.
	_, writes := a.c.Stats()
	srv.Set(t, "4", edgeConfig(20, true))
	waitAcked(t, srv, "4")
	if _, after := a.c.Stats(); after != writes {
		t.Fatalf("an unchanged state made %d etcd writes", after-writes)
	}

	// A limit no longer sent is deleted; the hand-set policy stays.
	only := edgeConfig(20, true)
	only.Descriptors = only.Descriptors[:1]
	srv.Set(t, "5", only)
	waitAcked(t, srv, "5")
	if _, err := storedPolicy(t, adm, "per-ip"); status.Code(err) != codes.NotFound {
		t.Fatalf("per-ip, no longer sent: %v", err)
	}
	if src := storedSource(t, a, prefix, "per-ip"); src != nil {
		t.Fatalf("the deleted policy's source stayed: %+v", src)
	}
	if _, err := storedPolicy(t, adm, "mine"); err != nil {
		t.Fatalf("the hand-set policy: %v", err)
	}

	// A new leader subscribes afresh and finds nothing to write.
	b := startReplica(t, prefix, "b", withXDS)
	streams := srv.Streams()
	a.stop()
	waitLeader(t, b)
	testenv.WaitFor(t, 10*time.Second, "the new leader's stream", func() bool { return srv.Streams() > streams })
	testenv.WaitFor(t, 10*time.Second, "the new leader ACKs", func() bool { return b.c.xdsMetrics.AppliedVersion() == "5" })
	if _, w := b.c.Stats(); w != 0 {
		t.Fatalf("the new leader wrote %d transactions for a state etcd already held", w)
	}

	// Without a subscription, the policies it left are the SRE's.
	b.stop()
	c, admC, _ := startLeader(t, prefix, "c", nil)
	if _, err := admC.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 99}\n"}); err != nil {
		t.Fatalf("quota set of a formerly xDS policy without a subscription: %v", err)
	}
	if src := storedSource(t, c, prefix, "edge.user"); src != nil {
		t.Fatalf("a policy set by hand kept its xDS source: %+v", src)
	}
}

// A coordinator that cannot reach its management server keeps serving the
// policies it stored, and applies the server's state once it is back.
func TestXDSServerAwayKeepsPolicies(t *testing.T) {
	srv := xdsserver.Start(t, "", "envoy-ratelimit", nil)
	srv.Set(t, "1", edgeConfig(10, false))
	withXDS := func(c *Config) { c.RateLimitXDS = xdsserver.Settings(srv.Addr, nil) }
	a, adm, _ := startLeader(t, testenv.Prefix(t), "a", withXDS)
	waitAcked(t, srv, "1")
	srv.Stop()
	testenv.WaitFor(t, 10*time.Second, "the stream's end seen", func() bool { return !a.c.xdsMetrics.Connected() })
	if p, err := storedPolicy(t, adm, "edge.user"); err != nil || p.Limit != 10 {
		t.Fatalf("with the server away: %+v, %v", p, err)
	}
	back := xdsserver.Start(t, srv.Addr, "envoy-ratelimit", nil)
	back.Set(t, "1", edgeConfig(30, false))
	testenv.WaitFor(t, 10*time.Second, "the restarted server's state applied", func() bool {
		p, err := storedPolicy(t, adm, "edge.user")
		return err == nil && p.Limit == 30
	})
}

// An envoyproxy/ratelimit configuration is stored by quota set as the
// policies it maps to, with their Envoy match; a global limit too small
// to give each of the 3 regions one request is refused with what to do.
func TestEnvoyConfigStored(t *testing.T) {
	_, adm, _ := startLeader(t, testenv.Prefix(t), "a", nil)
	setPolicy(t, adm, "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n"+
		"    rate_limit: {unit: second, requests_per_unit: 500}\n")
	got, err := adm.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: "mongo_cps.database_users"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.Json, `"domain":"mongo_cps"`) || !strings.Contains(got.Json, `"value":"users"`) {
		t.Fatalf("stored policy lacks its Envoy match:\n%s", got.Json)
	}
	small := "domain: sms\ndescriptors:\n  - key: to\n    rate_limit: {unit: day, requests_per_unit: 2}\n"
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: small}); err == nil || !strings.Contains(err.Error(), "raise") {
		t.Fatalf("2 per day shared by 3 regions: %v, want a refusal saying what to raise", err)
	}
}

// One quota set stores at most MaxPoliciesPerSet policies, all or none:
// a larger file is refused whole, with what to do, and stores nothing.
func TestQuotaSetAllOrNone(t *testing.T) {
	_, adm, _ := startLeader(t, testenv.Prefix(t), "a", nil)
	var b strings.Builder
	for i := 0; i <= MaxPoliciesPerSet; i++ {
		b.WriteString("---\nname: p" + strconv.Itoa(i) + "\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	}
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: b.String()}); err == nil || !strings.Contains(err.Error(), "split the file") {
		t.Fatalf("%d policies in one set: %v, want a refusal", MaxPoliciesPerSet+1, err)
	}
	list, err := adm.ListPolicies(t.Context(), &pb.ListPoliciesRequest{})
	if err != nil || len(list.Policies) != 0 {
		t.Fatalf("a refused set stored %d policies (%v)", len(list.Policies), err)
	}
}
