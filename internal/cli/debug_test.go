package cli

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// The debug listener has no authentication: an address that is not
// loopback is refused, naming the flag and what to do, unless insecure.
func TestDebugRefusesTheNetwork(t *testing.T) {
	stop, err := Debug{Addr: "0.0.0.0:0"}.Serve(hclog.NewNullLogger())
	if err == nil {
		stop()
		t.Fatal("--debug-listen 0.0.0.0:0 served without --insecure")
	}
	if !strings.Contains(err.Error(), "--debug-listen") || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("the refusal names neither the flag nor the way out: %v", err)
	}
	stop, err = Debug{Addr: "0.0.0.0:0", Insecure: true}.Serve(hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("--insecure: %v", err)
	}
	stop()
}
