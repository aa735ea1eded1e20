package agent

import (
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The answers' codes, overall and per descriptor.
const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// entries is a descriptor of the key-value pairs kv.
func entries(kv ...string) *commonrl.RateLimitDescriptor {
	d := &commonrl.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// d is the descriptors ds, as a request's list.
func d(ds ...*commonrl.RateLimitDescriptor) []*commonrl.RateLimitDescriptor { return ds }

// envoyClient runs region us's agent serving config (regionAgent, changed
// by mod) and is a client of its Envoy rate-limit service, over gRPC.
func envoyClient(t testing.TB, config string, mod func(*Config)) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(grpcConn(t, regionAgent(t, config, mod).grpcAddr))
}

// shouldRateLimit asks client about the descriptors ds of domain, failing
// t if the call fails.
func shouldRateLimit(t testing.TB, client rlsv3.RateLimitServiceClient, domain string,
	ds ...*commonrl.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit of %v in domain %q: %v", ds, domain, err)
	}
	return resp
}

// wantRefused asks client about the descriptors ds of domain and fails t,
// saying what was asked (what), unless the call fails with code and a
// message mentioning mention.
func wantRefused(t testing.TB, client rlsv3.RateLimitServiceClient, what string, code codes.Code, mention string,
	domain string, ds ...*commonrl.RateLimitDescriptor) {
	t.Helper()
	_, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if st := status.Convert(err); st.Code() != code || !strings.Contains(st.Message(), mention) {
		t.Fatalf("%s: %v, want %s mentioning %q", what, err, code, mention)
	}
}
