package lease

import (
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// The meter's rate is the hottest identity's, leaving out identities that
// hold shares of their own (AddOwn); Rates gives each identity's own rate
// over the last complete bucket and the current one, those at least the
// threshold and those asked for.
func TestMeterRates(t *testing.T) {
	m := NewMeter[string](MeterTracks(0))
	const start = 1_000_000 // ms, at a bucket's start
	for s := int64(0); s < 10; s++ {
		at := start + s*1000
		m.Add("cold", 1*policy.Micro, at)
		m.Add("warm", 3*policy.Micro, at)
		m.AddOwn("own", 8*policy.Micro, at)
	}
	now := int64(start + 10_000) // two whole buckets later
	if r := m.Rate(now); r < 2*policy.Micro || r > 3*policy.Micro {
		t.Fatalf("region's rate %d, want the hottest identity without its own shares (warm, about 3/s over the buckets seen)", r)
	}
	got := m.Rates(now, 2*policy.Micro, func(id string) bool { return id == "cold" })
	if got["own"] != 8*policy.Micro || got["warm"] != 3*policy.Micro || got["cold"] != 1*policy.Micro || len(got) != 3 {
		t.Fatalf("rates %v, want own 8/s, warm 3/s, and cold (asked for) 1/s", got)
	}
	if got := m.Rates(now, 4*policy.Micro, func(string) bool { return false }); len(got) != 1 {
		t.Fatalf("rates at least 4/s: %v, want only own", got)
	}
}
