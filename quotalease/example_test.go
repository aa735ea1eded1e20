package quotalease_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/quotalease"
)

// A client of the region's two agents over mTLS, deciding one request.
func Example() {
	var tlsConfig *tls.Config // the service's certificate and the deployment's CA
	c, err := quotalease.New(context.Background(), quotalease.Config{
		Agents:      []string{"agent-1.us.internal:7500", "agent-2.us.internal:7500"},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig))},
		Domain:      "shop",
		// The policy's edge settings: deny until the first assignment.
		Buckets: envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if c.Allow(map[string]string{"policy": "api-per-tenant", "tenant": "acme"}) {
		log.Print("serve the request")
	}
}

// An HTTP service limited per tenant, by its X-Tenant header.
func ExampleClient_Middleware_service() {
	var c *quotalease.Client // from quotalease.New
	limit, err := c.Middleware(quotalease.HTTPOptions{
		Bucket: func(r *http.Request) map[string]string {
			return map[string]string{"policy": "api-per-tenant", "tenant": r.Header.Get("X-Tenant")}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hello\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limit(mux)))
}

// What a refused request gets. Here no agent answers (nothing listens on
// the address), so no bucket is ever assigned and the policy's
// no-assignment behaviour, deny, decides every request.
func ExampleClient_Middleware() {
	c, err := quotalease.New(context.Background(), quotalease.Config{
		Agents:      []string{"127.0.0.1:1"},
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Domain:      "shop",
		Buckets:     envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	limit, err := c.Middleware(quotalease.HTTPOptions{Bucket: func(r *http.Request) map[string]string {
		return map[string]string{"policy": "api-per-tenant", "tenant": r.Header.Get("X-Tenant")}
	}})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("X-Tenant", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, resp.Header.Get("Content-Type"), "Retry-After:", resp.Header.Get("Retry-After"))
	fmt.Print(string(body))
	// Output:
	// 429 Too Many Requests application/problem+json Retry-After: 1
	// {"type":"urn:quota-lease:problem:rate-limited","title":"Too Many Requests","status":429,"detail":"policy api-per-tenant admits no more now; retry after 1s","policy":"api-per-tenant","retry_after_ms":1000}
}
