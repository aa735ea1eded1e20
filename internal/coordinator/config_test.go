package coordinator

import (
	"strings"
	"testing"
)

// DefaultConfig is valid once named; a zero is a value, not a default
// (Hysteresis 0 stays 0); ValidateConfig names every bad setting at once.
func TestDefaultAndValidateConfig(t *testing.T) {
	c := DefaultConfig()
	c.Name, c.Advertise = "c1", "127.0.0.1:7400"
	if err := ValidateConfig(c); err != nil {
		t.Fatalf("default config: %v", err)
	}
	c.Hysteresis = 0
	if err := ValidateConfig(c); err != nil || c.Hysteresis != 0 {
		t.Fatalf("hysteresis 0: %v (kept %v)", err, c.Hysteresis)
	}
	var bad Config // the zero Config: nothing defaults
	err := ValidateConfig(bad)
	for _, want := range []string{"name is empty", "advertise", "prefix", "clock and logger", "lease duration", "session TTL", "intervals", "max step", "lease call rate"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero config: %v, want it to name %q", err, want)
		}
	}
}
