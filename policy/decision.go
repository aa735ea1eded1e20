package policy

// Decision is the answer to one check.
type Decision struct {
	// Allowed reports whether the request was admitted and charged.
	Allowed bool
	// Remaining is the quota left after this decision, in micro-units;
	// 0 when the key is over its limit (Debt).
	Remaining int64
	// Debt is how far over its limit the key is after this decision, in
	// micro-units: what charges after the fact (Limits.PostHoc) counted
	// beyond it, or what a window used beyond a limit lowered since. A
	// check is refused until it is repaid (refilled, or out of the window).
	Debt int64
	// RetryAfterMs is, for a rejected request, how long the caller must wait
	// before the same request would be admitted if nothing else is charged
	// meanwhile. It is rounded up: waiting exactly this long is enough.
	// Zero when Allowed.
	RetryAfterMs int64
	// ResetAfterMs is how long until the key is back at its idle state (a
	// full bucket or an empty window) if nothing else is charged.
	ResetAfterMs int64
	// Replayed reports that this decision was made earlier for the same
	// idempotency key and returned again without charging.
	Replayed bool
	// Matched and Freed are a return's (Return): the micro-units matched
	// to units taken and not yet returned, and of those, the micro-units
	// given back as capacity. Zero for a charge, and for a replayed return.
	Matched, Freed int64
}

// SetLeft sets Remaining and Debt from what is left under the limit, raw:
// negative when the key is over it.
func (d *Decision) SetLeft(raw int64) {
	d.Remaining, d.Debt = max(0, raw), max(0, -raw)
}

// RemainingUnits is Remaining in whole units, rounded down.
func (d Decision) RemainingUnits() int64 { return d.Remaining / Micro }
