package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// The names Envoy Gateway gives a listener's domain and a route's
// descriptors (internal/xds/translator/ratelimit.go): a global limit per
// value of a header (a "distinct" header match) on one route rule.
const (
	egDomain = "default/eg/http"
	egRoute  = "httproute/default/api/rule/0/match/0/www_example_com"
	egRule   = "rule-0-match--1"
	egHeader = "rule-0-match-0"
)

// gatewayConfig is the RateLimitConfig Envoy Gateway serves for a
// BackendTrafficPolicy limiting each x-user-id to perDay requests a day.
func gatewayConfig(perDay uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: egDomain, Domain: egDomain, Descriptors: []*rlsconf.RateLimitDescriptor{
		{Key: egRoute, Value: egRoute, Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: egRule, Value: egRule, Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: egHeader, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: perDay}}}}}}}}
}

// The end to end path of configuration over xDS, as Envoy Gateway drives
// envoyproxy/ratelimit: a real go-control-plane management server serves a
// RateLimitConfig over mutual TLS, the coordinator's leader stores it as
// policies, an agent enforces them on Envoy's API. Each phase counts what
// a user never seen before is admitted in a row: exactly the limit the
// server last had applied.
//   - served: 5 a day;
//   - updated mid-run to 8: 8 for a new user, and 3 more for one who had
//     used 5 (the same counter goes on);
//   - a response that does not convert is NACKed with the reason, and
//     nothing changes;
//   - the server goes away: the limits stay enforced; restarted (reusing a
//     version string, as a restarted Envoy Gateway does), its state is
//     applied again;
//   - the limit is no longer served: the policy is deleted and the
//     descriptor is answered with no limit, as envoyproxy/ratelimit answers
//     a descriptor its configuration does not have.
func TestXDSConfigEnforcedEndToEnd(t *testing.T) {
	stls, ctls := xdsserver.TLS(t)
	srv := xdsserver.Start(t, "", "envoy-ratelimit", stls)
	srv.Set(t, "1", gatewayConfig(5, rlsconf.RateLimitUnit_DAY))
	k := startCoordinator(t, testenv.Prefix(t), "", func(c *coordinator.Config) {
		c.Regions = []string{"us"} // one region: it is leased the whole limit, which a count in a row then shows
		c.RateLimitXDS = xdsserver.Settings(srv.Addr, ctls)
	})
	testenv.WaitFor(t, 10*time.Second, "version 1 ACKed", func() bool { return srv.Acked("1") })
	ra := startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, nil)
	client := rlsv3.NewRateLimitServiceClient(grpcConn(t, ra.grpcAddr))

	call := func(user string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: egDomain,
			Descriptors: []*commonrl.RateLimitDescriptor{entries(egRoute, egRoute, egRule, egRule, egHeader, user)}})
		if err != nil {
			t.Fatalf("ShouldRateLimit for %s: %v", user, err)
		}
		return resp
	}
	// admitted counts a user's OK answers in a row, up to max+1 calls,
	// checking each answer names the limit.
	admitted := func(user string, max int, limit uint32) int {
		t.Helper()
		n := 0
		for i := 0; i <= max; i++ {
			resp := call(user)
			if cl := resp.Statuses[0].CurrentLimit; cl == nil || cl.RequestsPerUnit != limit || cl.Unit != rlsv3.RateLimitResponse_RateLimit_DAY {
				return -1 // not (yet) this limit
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				break
			}
			n++
		}
		return n
	}
	// enforces waits until a fresh user is admitted exactly limit times:
	// the agent has the policy and a lease of all of it.
	probes := 0
	enforces := func(limit uint32) {
		t.Helper()
		testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("a new user admitted exactly %d times", limit), func() bool {
			probes++
			return admitted(fmt.Sprintf("probe-%d", probes), int(limit), limit) == int(limit)
		})
	}

	enforces(5)
	stored := policyNames(t, k.addr)
	if stored == "" {
		t.Fatal("no policy stored")
	}
	if n := admitted("alice", 10, 5); n != 5 {
		t.Fatalf("alice admitted %d times under 5 a day", n)
	}

	srv.Set(t, "2", gatewayConfig(8, rlsconf.RateLimitUnit_DAY))
	testenv.WaitFor(t, 10*time.Second, "version 2 ACKed", func() bool { return srv.Acked("2") })
	enforces(8)
	// alice's refused call counted too, as envoyproxy/ratelimit counts
	// every hit (the configuration's post_hoc default): 6 of 8 used.
	if n := admitted("alice", 10, 8); n != 2 {
		t.Fatalf("alice, 5 admitted and 1 refused, admitted %d more under 8 a day; want 2", n)
	}

	bad := gatewayConfig(50, rlsconf.RateLimitUnit_UNKNOWN)
	srv.Set(t, "3", bad)
	testenv.WaitFor(t, 10*time.Second, "version 3 NACKed", func() bool { _, ok := srv.Nacked("3"); return ok })
	if detail, _ := srv.Nacked("3"); !strings.Contains(detail, egDomain) || !strings.Contains(detail, "unit") {
		t.Fatalf("NACK detail %q names neither the resource nor the unit", detail)
	}
	enforces(8)
	if n := admitted("alice", 10, 8); n != 0 {
		t.Fatalf("after a NACKed response alice was admitted %d more times", n)
	}

	srv.Stop()
	enforces(8) // the server away: nothing dropped
	if got := policyNames(t, k.addr); got != stored {
		t.Fatalf("policies with the server away: %q, were %q", got, stored)
	}
	back := xdsserver.Start(t, srv.Addr, "envoy-ratelimit", stls)
	back.Set(t, "1", gatewayConfig(8, rlsconf.RateLimitUnit_DAY))
	testenv.WaitFor(t, 10*time.Second, "the restarted server's version ACKed", func() bool { return back.Acked("1") })
	enforces(8)

	back.Set(t, "2")
	testenv.WaitFor(t, 10*time.Second, "the empty version ACKed", func() bool { return back.Acked("2") })
	testenv.WaitFor(t, 10*time.Second, "the descriptor answered with no limit", func() bool {
		resp := call("alice")
		return resp.OverallCode == rlsv3.RateLimitResponse_OK && resp.Statuses[0].CurrentLimit == nil
	})
	if got := policyNames(t, k.addr); got != "" {
		t.Fatalf("policies left after the server stopped sending them: %s", got)
	}
}

// policyNames lists the stored policies' names, comma-separated.
func policyNames(t *testing.T, addr string) string {
	t.Helper()
	cl, err := leaseapi.NewClient([]string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var resp *pb.ListPoliciesResponse
	err = cl.Call(context.Background(), func(cc *grpc.ClientConn, opts ...grpc.CallOption) (err error) {
		resp, err = pb.NewAdminServiceClient(cc).ListPolicies(context.Background(), &pb.ListPoliciesRequest{}, opts...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range resp.Policies {
		names = append(names, p.Name)
	}
	return strings.Join(names, ",")
}
