package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// The debug listener has no authentication: an address that is not
// loopback is refused, naming the flag and what to do, unless insecure,
// which is let through with a warning. Loopback and none pass silently.
func TestDebugRefusesTheNetwork(t *testing.T) {
	var logged bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logged})
	err := Debug{Addr: "0.0.0.0:6070"}.Check(log)
	if err == nil || !strings.Contains(err.Error(), "--debug-listen") || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("--debug-listen 0.0.0.0:6070 without --insecure: %v; want a refusal naming the flag and the way out", err)
	}
	for _, addr := range []string{"", "127.0.0.1:6070", "localhost:6070", "[::1]:6070"} {
		if err := (Debug{Addr: addr}).Check(log); err != nil {
			t.Errorf("--debug-listen %q: %v", addr, err)
		}
	}
	if logged.Len() != 0 {
		t.Fatalf("warned about loopback or no listener: %s", logged.String())
	}
	if err := (Debug{Addr: "0.0.0.0:6070", Insecure: true}).Check(log); err != nil || !strings.Contains(logged.String(), "without authentication") {
		t.Fatalf("--insecure: %v, logged %q; want it let through with a warning", err, logged.String())
	}
}
