package rlqsenvoy

import (
	"context"
	"testing"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsfake"
)

// newTestInstance is an instance of the fake on a manual clock whose
// report timer never fires by itself (tests call ReportNow).
func newTestInstance(t *testing.T, f *rlqsfake.Server, clk clock.Clock, set *rlqfv3.RateLimitQuotaBucketSettings) *Instance {
	t.Helper()
	cfg := testConfig(f.Addr, "envoy-0", clk, time.Hour)
	cfg.Settings = set
	return startInstance(t, cfg)
}

// startInstance is a new instance of cfg, closed when the test ends: for
// the tests whose configuration is their own.
func startInstance(t testing.TB, cfg Config) *Instance {
	t.Helper()
	in, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in
}

// withBucket starts a fake server and an instance on a manual clock, and
// makes the instance's first request, of tenantA, reported at once.
func withBucket(t *testing.T, set *rlqfv3.RateLimitQuotaBucketSettings) (*rlqsfake.Server, *clock.Manual, *Instance) {
	t.Helper()
	f := rlqsfake.Start(t)
	clk := &clock.Manual{}
	in := newTestInstance(t, f, clk, set)
	in.Allow(tenantA)
	f.WaitReports(t, 0, 1)
	return f, clk, in
}

// testConfig is an instance of domain "edge" at target, in plain text.
func testConfig(target, name string, clk clock.Clock, every time.Duration) Config {
	cfg := DefaultConfig()
	cfg.Name, cfg.Target, cfg.Domain, cfg.Clock, cfg.ReportInterval = name, target, "edge", clk, every
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	return cfg
}

// noAssignment is a no_assignment_behavior of strategy s.
func noAssignment(s *typev3.RateLimitStrategy) *rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior {
	return &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: s}}
}

// expiredFallback is an expired_assignment_behavior of strategy s for timeout.
func expiredFallback(timeout time.Duration, s *typev3.RateLimitStrategy) *rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior {
	return &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior{
		ExpiredAssignmentBehaviorTimeout: durationpb.New(timeout),
		ExpiredAssignmentBehavior:        &rlqfv3.RateLimitQuotaBucketSettings_ExpiredAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: s}}
}

// allowN makes n requests of id and returns how many were admitted.
func allowN(in *Instance, id map[string]string, n int) int {
	admitted := 0
	for range n {
		if in.Allow(id).Allowed {
			admitted++
		}
	}
	return admitted
}

func ttlOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func settingsWith(mut func(*rlqfv3.RateLimitQuotaBucketSettings)) *rlqfv3.RateLimitQuotaBucketSettings {
	s := &rlqfv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(time.Second)}
	mut(s)
	return s
}

func sameMsg(a, b proto.Message) bool { return proto.Equal(a, b) }
