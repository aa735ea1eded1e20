// Command limited-service is an HTTP service that limits its requests per
// tenant in-process with package quotalease: no call to the agent per
// request, and what it admits counted in the policy's global bound.
//
// It answers every request to / with 200 "hello <tenant>" unless the
// tenant (the X-Tenant header) is over its limit, which gets the agent's
// 429. Run it beside the region's agents:
//
//	limited-service --listen 127.0.0.1:8080 --agents agent-1:7500,agent-2:7500 \
//	    --tls-ca ca.pem --tls-cert service.pem --tls-key service-key.pem
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/quotalease"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "limited-service:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:8080", "address the service listens on")
	agents := flag.String("agents", "127.0.0.1:7500",
		"the region's agents' gRPC (RLQS) addresses, comma-separated, tried in order")
	domain := flag.String("domain", "shop", "the RLQS domain the agents serve")
	pol := flag.String("policy", "service-per-tenant",
		"the quota-lease policy limiting each tenant (one with edge settings)")
	deny := flag.Bool("deny-without-assignment", true,
		"refuse a tenant's requests until the agent assigns its bucket, as the policy's edge.no_assignment: deny states")
	report := flag.Duration("report-interval", quotalease.DefaultReportInterval,
		"how often usage is reported to the agent")
	ca := flag.String("tls-ca", "",
		"PEM CA that signs the agents' certificates; without it the agents are called in plain text")
	cert := flag.String("tls-cert", "", "PEM certificate of this service (mutual TLS)")
	key := flag.String("tls-key", "", "PEM private key of --tls-cert")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `Usage: limited-service [flags]

An HTTP service that limits each tenant (its X-Tenant header) in-process with
the quota-lease client library: no call to the agent per request, and what it
admits counted in the policy's global bound (docs/library.md). A refused
request gets 429, as the agent's HTTP API answers.

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()

	creds, err := transport(*ca, *cert, *key)
	if err != nil {
		return err
	}
	settings := envoy.Settings{}
	if *deny {
		settings.NoAssignment = envoy.Strategy{Kind: envoy.DenyAll}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := quotalease.New(ctx, quotalease.Config{
		Agents:         strings.Split(*agents, ","),
		DialOptions:    []grpc.DialOption{grpc.WithTransportCredentials(creds)},
		Domain:         *domain,
		Buckets:        settings,
		ReportInterval: *report,
	})
	if err != nil {
		return err
	}
	defer c.Close()

	limit, err := c.Middleware(quotalease.HTTPOptions{Bucket: func(r *http.Request) map[string]string {
		return map[string]string{"policy": *pol, "tenant": r.Header.Get("X-Tenant")}
	}})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s\n", r.Header.Get("X-Tenant"))
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with --listen)", *listen, err)
	}
	srv := &http.Server{Handler: limit(mux), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("serving on %s, limited by policy %s through %s", ln.Addr(), *pol, *agents)
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// transport is mutual TLS with the given files, or plain text without a CA.
func transport(ca, cert, key string) (credentials.TransportCredentials, error) {
	if ca == "" {
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", ca)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
	if cert != "" || key != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return credentials.NewTLS(cfg), nil
}
