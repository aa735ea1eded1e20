package quotalease_test

import (
	"context"
	"crypto/tls"
	"log"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

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
func ExampleClient_Middleware() {
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
