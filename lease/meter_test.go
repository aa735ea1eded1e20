package lease

import (
	"time"

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
		m.Add("cold", 1*policy.Micro, 0, at)
		m.Add("warm", 3*policy.Micro, 0, at)
		m.AddOwn("own", 8*policy.Micro, 0, at)
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
		m.Add(id, policy.Micro, 0, at)
	}
	if got := m.Rates(at+1, 0, func(int) bool { return false }); len(got) != 2 {
		t.Fatalf("tracked %d identities, want 2", len(got))
	}
	m.SetTracks(4)
	for id := 0; id < 5; id++ {
		m.Add(id, policy.Micro, 0, at+2)
	}
	if got := m.Rates(at+3, 0, func(int) bool { return false }); len(got) != 4 {
		t.Fatalf("tracked %d identities after raising to 4, want 4", len(got))
	}
	if MeterTracks(0) != 10_000 || MeterTracks(100_000) != 400_000 {
		t.Fatalf("MeterTracks: %d, %d", MeterTracks(0), MeterTracks(100_000))
	}
}

// A meter younger than its two buckets (a restarted agent's) measures
// over its own age, a second at least: its first seconds' demand is not
// read as a fifth of itself, which would shrink the region's shares until
// it caught up.
func TestYoungMeterRates(t *testing.T) {
	m := NewMeter[string](10)
	start := int64(1_000_000_000_000) // ms, mid-bucket
	m.Rates(start, 0, func(string) bool { return true })
	for i := range int64(20) {
		m.Add("x", 50, 0, start+100*i) // 1,000 over 2 s: 500 a second
	}
	if age := m.Age(start + 2000); age != 2*time.Second {
		t.Fatalf("age %v, want 2s", age)
	}
	if r := m.Rates(start+2000, 0, func(string) bool { return true })["x"]; r < 450 || r > 550 {
		t.Fatalf("a two-second-old meter reads %d a second, want about 500", r)
	}
	// Its first requests do not read as a burst: a second at least.
	n := NewMeter[string](10)
	n.Rates(start, 0, func(string) bool { return true })
	n.Add("x", 50, 0, start+10)
	if r := n.Rates(start+20, 0, func(string) bool { return true })["x"]; r > 50 {
		t.Fatalf("a meter 20 ms old reads %d a second for 50 asked", r)
	}
}
