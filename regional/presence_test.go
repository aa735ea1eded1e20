package regional

import (
	"testing"
	"time"
)

// The presence hash counts instances by the name a nonce leads with,
// names with dashes included.
func TestNonceInstance(t *testing.T) {
	now := time.Unix(1_700_000_000, 5)
	for _, inst := range []string{"us-1", "a", "eu-west-1-agent-0", "x--y"} {
		if got := nonceInstance(NewNonce(inst, now)); got != inst {
			t.Errorf("nonceInstance(NewNonce(%q)) = %q", inst, got)
		}
	}
}
