package envflag

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cert := fs.String("tls-cert", "", "")
	timeout := fs.Duration("check-timeout", time.Second, "")
	region := fs.String("region", "", "")
	t.Setenv("QUOTALEASE_TLS_CERT", "/etc/c.pem")
	t.Setenv("QUOTALEASE_CHECK_TIMEOUT", "50ms")
	t.Setenv("QUOTALEASE_REGION", "eu")
	if err := Apply(fs); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--region", "us"}); err != nil {
		t.Fatal(err)
	}
	if *cert != "/etc/c.pem" || *timeout != 50*time.Millisecond || *region != "us" {
		t.Fatalf("cert %q timeout %v region %q: want env values, and the command line to win", *cert, *timeout, *region)
	}
	t.Setenv("QUOTALEASE_CHECK_TIMEOUT", "soon")
	if err := Apply(fs); err == nil || !strings.Contains(err.Error(), "QUOTALEASE_CHECK_TIMEOUT") {
		t.Fatalf("bad value: %v", err)
	}
}
