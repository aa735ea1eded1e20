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

// A meter tracks at most its number of identities per bucket; raising it
// (a policy's identity_shares raised) lets more in at once.
func TestMeterTracks(t *testing.T) {
	m := NewMeter[int](2)
	const at = 1_000_000
	for id := 0; id < 5; id++ {
		m.Add(id, policy.Micro, at)
	}
	if got := m.Rates(at+1, 0, func(int) bool { return false }); len(got) != 2 {
		t.Fatalf("tracked %d identities, want 2", len(got))
	}
	m.SetTracks(4)
	for id := 0; id < 5; id++ {
		m.Add(id, policy.Micro, at+2)
	}
	if got := m.Rates(at+3, 0, func(int) bool { return false }); len(got) != 4 {
		t.Fatalf("tracked %d identities after raising to 4, want 4", len(got))
	}
	if MeterTracks(0) != 10_000 || MeterTracks(100_000) != 400_000 {
		t.Fatalf("MeterTracks: %d, %d", MeterTracks(0), MeterTracks(100_000))
	}
}
