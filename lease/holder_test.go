package lease

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// An agent renews when its grant says (RenewAfter), not later than its own
// validity allows, and at a third of its validity when the grant says
// nothing.
func TestGrantRenewAfterHonoured(t *testing.T) {
	tm := Timing{ValidFor: 9 * time.Second, Drift: 0, Margin: 0, DegradedTimeout: time.Minute}
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		renewAfter, due time.Duration
	}{
		{0, 3 * time.Second},                // a third of the validity
		{time.Second, time.Second},          // earlier, as asked
		{5 * time.Second, 5 * time.Second},  // later, still before the end
		{20 * time.Second, 3 * time.Second}, // past the end: ignored
	} {
		a := NewHolder(tm, policy.Failure{}, 100)
		req := a.Sending(t0)
		a.Granted(req, Grant{ID: "1", Amount: 10, ValidFor: tm.ValidFor, RenewAfter: c.renewAfter})
		if a.NeedsRenewal(t0.Add(c.due-time.Millisecond)) || !a.NeedsRenewal(t0.Add(c.due)) {
			t.Errorf("renew after %v: want renewal due at %v", c.renewAfter, c.due)
		}
	}
}

// A coordinator that assumes more drift than the agent was configured with
// shortens the agent's trust in grants accordingly; less is ignored.
func TestRaiseDrift(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		own, coordinator float64
		want             time.Duration
	}{
		{0, 0.005, 2*time.Second - 20*time.Millisecond - 10*time.Millisecond}, // 2*0.005*2s, then the margin
		{0.005, 0, 2*time.Second - 20*time.Millisecond - 10*time.Millisecond},
		{0, 0, 2*time.Second - 10*time.Millisecond},
	} {
		a := NewHolder(Timing{Drift: c.own, Margin: 10 * time.Millisecond}, policy.Failure{}, 100)
		a.RaiseDrift(c.coordinator)
		req := a.Sending(t0)
		a.Granted(req, Grant{ID: "1", Amount: 10, ValidFor: 2 * time.Second})
		if _, until := a.Grant(); until.Sub(t0) != c.want {
			t.Errorf("own drift %v, coordinator's %v: trusted for %v, want %v", c.own, c.coordinator, until.Sub(t0), c.want)
		}
	}
}

// Looking ahead past a grant's validity (the edge sizes assignments that
// outlive now) changes nothing: the grant is still enforced now, whole,
// also under fail-open, whose degraded budget is larger than the share.
func TestEnforceAtChangesNothing(t *testing.T) {
	tm := Timing{ValidFor: 9 * time.Second, DegradedTimeout: time.Minute}
	t0 := time.Unix(1000, 0)
	a := NewHolder(tm, policy.Failure{Mode: policy.FailOpen, OpenFraction: 0.5}, 1000)
	req := a.Sending(t0)
	a.Granted(req, Grant{ID: "1", Amount: 100, ValidFor: tm.ValidFor})
	_, until := a.Grant()
	if amt, mode := a.EnforceAt("", until.Add(time.Second)); mode != ModeDegraded || amt != 500 {
		t.Fatalf("after the grant: %d %v, want the open budget 500, degraded", amt, mode)
	}
	if amt, mode := a.Enforce("", t0.Add(time.Second)); mode != ModeLeased || amt != 100 {
		t.Fatalf("now, after looking ahead: %d %v, want the grant's 100, leased", amt, mode)
	}
}
