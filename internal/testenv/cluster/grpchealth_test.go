package cluster

import (
	"context"
	"net/http"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// The agent's gRPC health status, what Kubernetes' gRPC probes and Envoy's
// health checks read, follows its readiness (/readyz) as the presence
// round tells it of changes, with no timer of its own: SERVING once ready,
// NOT_SERVING while its Redis is cut off, SERVING again when Redis is
// back, each within a few presence rounds (one a second; the bound is
// generous for a loaded machine, and a change never told fails it).
func TestGRPCHealthFollowsReadiness(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	us := c.Agents[0]
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	watch, err := healthpb.NewHealthClient(us.checkCon).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	await := func(want healthpb.HealthCheckResponse_ServingStatus, why string) {
		t.Helper()
		began := time.Now()
		for {
			resp, err := watch.Recv()
			if err != nil {
				t.Fatalf("%s: the health watch ended before %s: %v", why, want, err)
			}
			if resp.Status != want {
				continue
			}
			t.Logf("%s: %s after %v", why, want, time.Since(began).Round(time.Millisecond))
			if took := time.Since(began); took > 10*time.Second {
				t.Fatalf("%s: %s only after %v, ten presence rounds", why, want, took)
			}
			return
		}
	}
	readyz := func() int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, us.HTTP+"/readyz", nil)
		resp, err := us.web.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	await(healthpb.HealthCheckResponse_SERVING, "a started agent")
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("gRPC health SERVING while /readyz answers %d", code)
	}
	us.ToRedis.Cut()
	await(healthpb.HealthCheckResponse_NOT_SERVING, "Redis cut off")
	if code := readyz(); code == http.StatusOK {
		t.Fatal("gRPC health NOT_SERVING while /readyz answers 200")
	}
	us.ToRedis.Restore()
	await(healthpb.HealthCheckResponse_SERVING, "Redis back")
}
