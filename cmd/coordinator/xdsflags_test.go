package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/internal/devca"
)

// A subscription over TLS whose CA is the deployment's own must name the
// management server's identity: that CA signs every agent and service.
// Named, the client is pinned to it; another CA needs no name.
func TestXDSServerOnTheDeploymentCAIsPinned(t *testing.T) {
	dir := t.TempDir()
	deployment, err := devca.New(dir, "deployment")
	if err != nil {
		t.Fatal(err)
	}
	other, err := devca.New(t.TempDir(), "gateway")
	if err != nil {
		t.Fatal(err)
	}
	opts := func(ca string, args ...string) *xdsOptions {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		o := addXDSFlags(fs)
		if err := fs.Parse(append([]string{"--ratelimit-xds", "xds.internal:18001", "--ratelimit-xds-tls-ca", ca}, args...)); err != nil {
			t.Fatal(err)
		}
		return o
	}
	warn := func(string) {}
	if _, err := opts(deployment.CertFile).settings(false, deployment.CertFile, warn); err == nil || !strings.Contains(err.Error(), "--ratelimit-xds-server-id") {
		t.Errorf("the deployment's CA without a server id: %v, want refused naming --ratelimit-xds-server-id", err)
	}
	s, err := opts(deployment.CertFile, "--ratelimit-xds-server-id", "spiffe://qd/role/xds").settings(false, deployment.CertFile, warn)
	if err != nil || s.TLS == nil || s.TLS.VerifyConnection == nil {
		t.Errorf("the deployment's CA with a server id: %+v %v, want a pinned TLS client", s, err)
	}
	if s, err := opts(other.CertFile).settings(false, deployment.CertFile, warn); err != nil || s.TLS.VerifyConnection != nil {
		t.Errorf("another CA: %+v %v, want TLS, not pinned", s, err)
	}
}
