package quotalease_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/quotalease"
)

// byTenant is the bucket of a request: its X-Tenant, none without one.
func byTenant(r *http.Request) map[string]string {
	t := r.Header.Get("X-Tenant")
	if t == "" {
		return nil
	}
	return map[string]string{"policy": "api-per-tenant", "tenant": t}
}

// serve is the middleware of c with opts around a handler that answers
// 200, as a test server.
func serve(t *testing.T, c *quotalease.Client, opts quotalease.HTTPOptions) *httptest.Server {
	t.Helper()
	mw, err := c.Middleware(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, url, tenant string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A refused request gets the agent's 429: problem+json naming the policy,
// Retry-After, no-store, and the RateLimit fields (draft-06 by default),
// which an admitted one carries too.
func TestMiddlewareAnswersAsTheAgent(t *testing.T) {
	_, _, c := assigned(t, 2, 1, nil)
	srv := serve(t, c, quotalease.HTTPOptions{Bucket: byTenant})
	first := get(t, srv.URL, "acme")
	if first.StatusCode != 200 || first.Header.Get("RateLimit-Remaining") != "1" || first.Header.Get("RateLimit-Policy") != "1;w=1" {
		t.Errorf("first: %d %v, want 200 with 1 of 1/s left", first.StatusCode, first.Header)
	}
	get(t, srv.URL, "acme")
	refused := get(t, srv.URL, "acme")
	if refused.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third request of a bucket of 2: %d, want 429", refused.StatusCode)
	}
	h := refused.Header
	if h.Get("Content-Type") != "application/problem+json" || h.Get("Retry-After") != "1" || h.Get("Cache-Control") != "no-store" ||
		h.Get("RateLimit-Remaining") != "0" {
		t.Errorf("429 fields: %v", h)
	}
	var p map[string]any
	body, _ := io.ReadAll(refused.Body)
	if err := json.Unmarshal(body, &p); err != nil || p["type"] != httplimit.ProblemRateLimited || p["policy"] != "api-per-tenant" ||
		p["status"] != float64(429) {
		t.Errorf("429 body %s (%v), want the rate-limited problem of api-per-tenant", body, err)
	}
	if resp := get(t, srv.URL, ""); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Remaining") != "" {
		t.Errorf("a request without a bucket: %d %v, want through undecided", resp.StatusCode, resp.Header)
	}
}

// draft-11 and none are chosen as the agent chooses them; anything else is
// refused when the middleware is built.
func TestMiddlewareHeaderVersions(t *testing.T) {
	_, _, c := assigned(t, 5, 5, nil)
	d11 := serve(t, c, quotalease.HTTPOptions{Bucket: byTenant, RateLimitHeaders: "draft-11", Policy: "api"})
	if got := get(t, d11.URL, "acme").Header; got.Get("RateLimit-Policy") != `"api";q=5;w=1` || got.Get("RateLimit") != `"api";r=4;t=1` {
		t.Errorf("draft-11: %v", got)
	}
	none := serve(t, c, quotalease.HTTPOptions{Bucket: byTenant, RateLimitHeaders: "none"})
	if got := get(t, none.URL, "acme").Header; got.Get("RateLimit-Policy") != "" || got.Get("RateLimit-Limit") != "" {
		t.Errorf("none: %v", got)
	}
	for _, bad := range []quotalease.HTTPOptions{{Bucket: byTenant, RateLimitHeaders: "draft-12"}, {}, {Bucket: byTenant, Policy: "Bad Name"}} {
		if _, err := c.Middleware(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A refused gRPC call ends with ResourceExhausted and when to retry.
func TestInterceptorRefuses(t *testing.T) {
	_, _, c := assigned(t, 1, 1, nil)
	opts := quotalease.GRPCOptions{Bucket: func(context.Context, string) map[string]string { return acme }}
	unary := c.UnaryInterceptor(opts)
	ran := 0
	handler := func(context.Context, any) (any, error) { ran++; return "ok", nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/shop.Cart/Add"}
	if _, err := unary(context.Background(), nil, info, handler); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := unary(context.Background(), nil, info, handler)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || ran != 1 {
		t.Fatalf("second call: %v (handler ran %d times), want ResourceExhausted before the handler", err, ran)
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if delay <= 0 || delay > time.Second {
		t.Errorf("retry delay %v, want within the second one token takes", delay)
	}
	stream := c.StreamInterceptor(opts)
	err = stream(nil, fakeServerStream{}, &grpc.StreamServerInfo{FullMethod: "/shop.Cart/Watch"},
		func(any, grpc.ServerStream) error { ran++; return nil })
	if status.Code(err) != codes.ResourceExhausted || ran != 1 {
		t.Errorf("stream: %v, want ResourceExhausted before the handler", err)
	}
}

type fakeServerStream struct{ grpc.ServerStream }

func (fakeServerStream) Context() context.Context { return context.Background() }
