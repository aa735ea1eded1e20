package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv/impostor"
)

// Any leaf of the deployment's CA could serve as a coordinator: the CLI
// checked only the chain and the host name, so `quota set` against a
// server holding the service or an agent's certificate stored its
// policies there. Now the CLI accepts only a server whose certificate
// names spiffe://<domain>/role/coordinator, and says so; the real
// coordinator certificate of the same set is accepted.
func TestCLIRefusesImpostorCoordinator(t *testing.T) {
	dir := t.TempDir()
	if code, _, errs := runCmd(t, "certs", "--dir", dir, "--regions", "us"); code != 0 {
		t.Fatal(errs)
	}
	files := func(name string) mtls.Files {
		return mtls.Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, "quota-lease-ca.pem")}
	}
	quotaSet := func(addr string) (int, string) {
		code, out, errs := runCmd(t, "quota", "set", "-f", "../../examples/policies.yaml", "--coordinator", addr, "--timeout", "1s",
			"--tls-ca", filepath.Join(dir, "quota-lease-ca.pem"), "--tls-cert", filepath.Join(dir, "admin.pem"), "--tls-key", filepath.Join(dir, "admin-key.pem"))
		return code, out + errs
	}
	for name, named := range map[string]string{"service": "no identity", "agent-us": "spiffe://quota-lease/region/us"} {
		fake := impostor.Start(t, files(name))
		code, out := quotaSet(fake.Addr)
		if code != 1 || fake.Answered.Load() != 0 {
			t.Fatalf("quota set against a server with %s.pem: exit %d, %d calls answered:\n%s", name, code, fake.Answered.Load(), out)
		}
		t.Logf("%s.pem refused: %s", name, strings.TrimSpace(out))
		for _, want := range []string{named, "not spiffe://quota-lease/role/coordinator", "no coordinator of this deployment", "Check the address"} {
			if !strings.Contains(out, want) {
				t.Errorf("refusing %s.pem, the CLI does not say %q:\n%s", name, want, out)
			}
		}
	}
	real := impostor.Start(t, files("coordinator"))
	if code, out := quotaSet(real.Addr); code != 0 || !strings.Contains(out, "stored policy") {
		t.Fatalf("a server with the coordinator certificate was refused: exit %d\n%s", code, out)
	}
	// A refused certificate at one address does not stop the CLI from
	// trying the next replica.
	fake := impostor.Start(t, files("service"))
	if code, out := quotaSet(fake.Addr + "," + real.Addr); code != 0 || !strings.Contains(out, "stored policy") {
		t.Fatalf("an impostor listed before the coordinator: exit %d\n%s", code, out)
	}
}
