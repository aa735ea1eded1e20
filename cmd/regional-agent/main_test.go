package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// The load command runs against a real Redis and reports every policy
// within its limit.
func TestLoad(t *testing.T) {
	srv := redistest.Start(t)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"load", "--redis", srv.Addr, "--policies", "../../examples/policies.yaml",
		"--duration", "1500ms", "--max-requests", "20000", "--workers", "4"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "OVER") || strings.Count(out.String(), " ok") != 3 {
		t.Fatalf("demo report:\n%s", out.String())
	}
}

func TestLoadBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cases := []struct {
		args []string
		code int
		text string
	}{
		{[]string{"load", "--policies", "/nope.yaml"}, 1, "read policies"},
		{[]string{"load", "--redis", "127.0.0.1:1", "--policies", "../../examples/policies.yaml"}, 1, "make redis"},
		{[]string{"load", "--workers", "0"}, 2, "must be positive"},
		{[]string{"load", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"demo", "--bin", "/nonexistent"}, 2, "quota-lease-demo"},
		{[]string{"serve"}, 2, "--region is required"},
		{[]string{"serve", "--region", "us", "--grpc-listen", "0.0.0.0:0"}, 1, "pass --insecure"},
		{[]string{"serve", "--region", "us", "--tls-cert", "c.pem"}, 1, "--tls-key"},
		{[]string{"serve", "--region", "us", "--log-level", "bogus"}, 1, "use trace, debug"},
		{[]string{"serve", "--config", "/nonexistent.yaml"}, 1, "--config"},
		{[]string{"serve", "--config", "../../deploy/config/agent.yaml"}, 1, "/etc/quota-lease/agent.pem"}, // the file's settings apply
		{[]string{"serve", "--region", "us", "--redis", "mongodb://x"}, 1, "unknown scheme"},
		{[]string{"serve", "--region", "us", "--redis", "redis+sentinel://s1:26379"}, 1, "name the master"},
		{[]string{"frobnicate"}, 2, "unknown command"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if code := run(ctx, c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.text) {
			t.Errorf("%v: exit %d, stderr %q; want %d mentioning %q", c.args, code, errb.String(), c.code, c.text)
		}
	}
}
