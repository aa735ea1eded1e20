package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv/impostor"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// The agent's lease client, made from serve's flags as serve makes it,
// accepts only a server whose certificate names the coordinator identity:
// a server holding another region's or a service's certificate of the
// same CA is refused at the handshake (before, it could hand the agent any
// share), and the error says why. The coordinator's certificate is
// accepted; so is it only in the trust domain the agent is given.
func TestLeaseClientRefusesImpostorCoordinator(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.New(dir, "quota-lease")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string, id *caller.ID) mtls.Files {
		l := devca.Leaf{Name: name}
		if id != nil {
			l.URIs = append(l.URIs, caller.URI("quota-lease", *id))
		}
		cert, key, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		return mtls.Files{Cert: cert, Key: key, CA: ca.CertFile}
	}
	us := issue("agent-us", &caller.ID{Kind: caller.Region, Name: "us"})
	servers := map[string]mtls.Files{
		"service":     issue("service", nil),
		"agent-eu":    issue("agent-eu", &caller.ID{Kind: caller.Region, Name: "eu"}),
		"coordinator": issue("coordinator", &caller.CoordinatorID),
	}
	lease := func(server mtls.Files, domain string) (*impostor.Server, error) {
		fake := impostor.Start(t, server)
		o, err := serveFlags([]string{"--region", "us", "--instance", "us-a", "--coordinator", fake.Addr, "--trust-domain", domain,
			"--tls-cert", us.Cert, "--tls-key", us.Key, "--coordinator-tls-ca", filepath.Join(dir, "quota-lease-ca.pem")}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := o.config(io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cl, err := leaseapi.NewClient(sc.coordinators)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cl.UseTLS(sc.coordTLS)
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err = cl.Lease(ctx, &pb.LeaseRequest{Region: "us", Instance: "us-a", Nonce: "n", Quotas: []*pb.QuotaRequest{{Quota: "api"}}})
		return fake, err
	}
	for _, name := range []string{"service", "agent-eu"} {
		fake, err := lease(servers[name], "quota-lease")
		if err == nil || fake.Answered.Load() != 0 {
			t.Fatalf("the agent leased from a server with %s.pem: %v", name, err)
		}
		if !strings.Contains(err.Error(), "not spiffe://quota-lease/role/coordinator") {
			t.Errorf("refusing %s.pem, the error does not say why: %v", name, err)
		}
	}
	if _, err := lease(servers["coordinator"], "quota-lease"); err != nil {
		t.Fatalf("the coordinator's certificate was refused: %v", err)
	}
	if _, err := lease(servers["coordinator"], "other-domain"); err == nil || !strings.Contains(err.Error(), "spiffe://other-domain/role/coordinator") {
		t.Fatalf("a coordinator of another trust domain was accepted: %v", err)
	}
}
