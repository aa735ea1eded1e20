package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// coordinator certs writes a CA and certificates whose identities the
// coordinator reads back, and refuses to overwrite a CA.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--regions", "us,eu"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	tl, err := tls.LoadX509KeyPair(filepath.Join(dir, "agent-eu.pem"), filepath.Join(dir, "agent-eu-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(tl.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if id, err := caller.FromCert(cert, "quota-lease"); err != nil || id != (caller.ID{Kind: caller.Region, Name: "eu"}) {
		t.Fatalf("agent-eu.pem names %v (%v)", id, err)
	}
	if _, err := mtls.Client(mtls.Files{CA: filepath.Join(dir, "quota-lease-ca.pem"), Cert: filepath.Join(dir, "admin.pem"), Key: filepath.Join(dir, "admin-key.pem")}, ""); err != nil {
		t.Fatalf("admin files unusable: %v", err)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--regions", "us"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "already holds a CA") {
		t.Fatalf("overwrote a CA: exit %d %s", code, errb.String())
	}
}
