package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// coordinator certs writes a CA and certificates whose identities the
// coordinator reads back, puts --hosts only into the coordinator's and
// --agent-hosts only into the agents', and refuses to overwrite a CA.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--regions", "us,eu",
		"--hosts", "coord.example,*.coord.example,10.0.0.7", "--agent-hosts", "agent.example"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for name, want := range map[string]caller.ID{
		"agent-eu":    {Kind: caller.Region, Name: "eu"},
		"coordinator": caller.CoordinatorID,
		"admin":       {Kind: caller.Role, Name: caller.Admin},
		"viewer":      {Kind: caller.Role, Name: caller.Viewer},
	} {
		if id, err := caller.FromCert(leaf(t, dir, name), "quota-lease"); err != nil || id != want {
			t.Errorf("%s.pem names %v (%v), want %v", name, id, err, want)
		}
	}
	for name, want := range map[string][]string{
		"coordinator": {"localhost", "coord.example", "*.coord.example"},
		"agent-us":    {"localhost", "agent.example"},
		"admin":       {"localhost"},
		"service":     {"localhost"},
	} {
		if got := leaf(t, dir, name).DNSNames; !slices.Equal(got, want) {
			t.Errorf("%s.pem serves %v, want %v", name, got, want)
		}
	}
	if c := leaf(t, dir, "coordinator"); c.VerifyHostname("10.0.0.7") != nil || c.VerifyHostname("coord-1.coord.example") != nil {
		t.Error("the coordinator certificate does not serve its --hosts IP or wildcard")
	}
	if _, err := mtls.Client(mtls.Files{CA: filepath.Join(dir, "quota-lease-ca.pem"), Cert: filepath.Join(dir, "admin.pem"), Key: filepath.Join(dir, "admin-key.pem")}, ""); err != nil {
		t.Fatalf("admin files unusable: %v", err)
	}
	errb.Reset()
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--regions", "us"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "already holds a CA") {
		t.Fatalf("overwrote a CA: exit %d %s", code, errb.String())
	}
}

// coordinator certs issue signs later certificates from the same CA: a
// per-instance one with an expiry, a reissued region one (rotation), and
// refuses what it cannot mean.
func TestCertsIssue(t *testing.T) {
	dir := t.TempDir()
	if code, _, errs := runCmd(t, "certs", "--dir", dir, "--regions", "us"); code != 0 {
		t.Fatal(errs)
	}
	caPool := x509.NewCertPool()
	caPool.AddCert(leafFile(t, filepath.Join(dir, "quota-lease-ca.pem"), filepath.Join(dir, "quota-lease-ca-key.pem")))
	code, out, errs := runCmd(t, "certs", "issue", "--dir", dir, "--region", "us", "--instance", "us-a", "--valid-for", "720h")
	if code != 0 || !strings.Contains(out, "agent-us.us-a.pem") || !strings.Contains(out, "spiffe://quota-lease/region/us/instance/us-a") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	c := leaf(t, dir, "agent-us.us-a")
	if id, err := caller.FromCert(c, "quota-lease"); err != nil || id != (caller.ID{Kind: caller.Region, Name: "us", Instance: "us-a"}) {
		t.Fatalf("agent-us.us-a.pem names %v (%v)", id, err)
	}
	if left := time.Until(c.NotAfter); left < 719*time.Hour || left > 721*time.Hour {
		t.Fatalf("--valid-for 720h gave a certificate valid for %v", left)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: caPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("not signed by the deployment's CA: %v", err)
	}
	before := leaf(t, dir, "agent-us").SerialNumber
	if code, _, errs := runCmd(t, "certs", "issue", "--dir", dir, "--region", "us", "--hosts", "agent-us.internal"); code != 0 {
		t.Fatal(errs)
	}
	if c := leaf(t, dir, "agent-us"); c.SerialNumber.Cmp(before) == 0 || c.VerifyHostname("agent-us.internal") != nil {
		t.Fatal("agent-us.pem was not reissued with its host")
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--role", "root"}, "admin, viewer or coordinator"},
		{[]string{"--region", "us", "--role", "admin"}, "exactly one"},
		{[]string{"--instance", "us-a"}, "exactly one"},
		{[]string{"--role", "admin", "--hosts", "x.example"}, "only into a server's certificate"},
		{[]string{"--region", "../etc"}, "not a usable name"},
		{[]string{"--region", "us", "--valid-for", "-1h"}, "--valid-for must be positive"},
	} {
		args := append([]string{"certs", "issue", "--dir", dir}, bad.args...)
		if code, out, errs := runCmd(t, args...); code == 0 || !strings.Contains(out+errs, bad.want) {
			t.Errorf("%v: exit %d, %s%s; want a refusal saying %q", bad.args, code, out, errs, bad.want)
		}
	}
	if code, _, errs := runCmd(t, "certs", "issue", "--dir", t.TempDir(), "--role", "admin"); code == 0 || !strings.Contains(errs, "load the CA") {
		t.Errorf("issued without a CA: %s", errs)
	}
}

// leaf parses dir's certificate <name>.pem (and checks its key matches).
func leaf(t *testing.T, dir, name string) *x509.Certificate {
	t.Helper()
	return leafFile(t, filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
}

func leafFile(t *testing.T, cert, key string) *x509.Certificate {
	t.Helper()
	tl, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(tl.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}
