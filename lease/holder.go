package lease

import (
	"errors"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// State is where a lease is in its life.
type State string

// Lease states. The agent moves through requested, active, renewing,
// expired and degraded; the coordinator sees active, shrinking (a smaller
// grant not yet acknowledged), expired (lapsed, nothing reserved) and
// degraded (lapsed, degraded budget reserved).
const (
	Requested State = "requested"
	Active    State = "active"
	Renewing  State = "renewing"
	Shrinking State = "shrinking"
	Expired   State = "expired"
	Degraded  State = "degraded"
)

// Mode is how a decision was made: on the leased share, on the degraded
// budget, with nothing at all (the lease's own modes, Holder.Enforce), on
// the agent's in-process fallback when Redis is slow or down, or under a
// region-scoped policy that no lease governs. Agents report it with every
// decision and in their metrics; the simulator counts by it.
type Mode string

// The modes a decision is made in.
const (
	ModeLeased        Mode = "leased"
	ModeDegraded      Mode = "degraded"
	ModeNone          Mode = "unleased"
	ModeLocalFallback Mode = "local-fallback"
	ModeRegion        Mode = "region"
)

// Holder is one quota's lease as a regional agent process holds it. It is
// not safe for concurrent use; the agent guards it.
type Holder struct {
	timing  Timing
	failure policy.Failure
	total   int64

	state      State
	grant      Grant     // the grant being enforced
	grantSeq   uint64    // the request it answered
	sentAt     time.Time // that request's send time
	validUntil time.Time // agent clock: sentAt + AgentValidFor
	present    string    // grant id to present on the next request
	seq        uint64
	pending    int  // requests in flight
	tried      bool // a request was answered or failed
	restored   bool // grant is an earlier process's (Restore), not yet replaced
}

// Request is one lease request a Holder is about to send.
type Request struct {
	// Seq numbers the request; answers to older requests than the
	// installed grant's are ignored.
	Seq uint64
	// GrantID is the grant to present (and so acknowledge), or "".
	GrantID string
	// SentAt is the agent's clock when it sends; validity counts from it.
	SentAt time.Time
}

// NewHolder returns a lease in state requested for a quota of total amount
// with failure policy f.
func NewHolder(t Timing, f policy.Failure, total int64) *Holder {
	return &Holder{timing: t, failure: f, total: total, state: Requested}
}

// Sending returns the request to send at now. Its answer goes to Granted
// or Failed.
func (a *Holder) Sending(now time.Time) Request {
	a.seq++
	a.pending++
	a.advance(now)
	if a.state == Active {
		a.state = Renewing
	}
	return Request{Seq: a.seq, GrantID: a.present, SentAt: now}
}

// Granted installs the grant answering req, unless a newer request's
// grant is already installed.
func (a *Holder) Granted(req Request, g Grant) {
	a.done()
	if a.grant.ID != "" && req.Seq < a.grantSeq {
		return
	}
	// The grant's duration rules: validity and the renewal time follow it,
	// whatever this agent was configured with.
	a.timing.ValidFor = g.ValidFor
	a.grant, a.grantSeq, a.sentAt = g, req.Seq, req.SentAt
	a.validUntil = req.SentAt.Add(a.timing.AgentValidFor())
	a.present = g.ID
	a.state = Active
	a.tried, a.restored = true, false
}

// Restore installs g, a grant an earlier agent process of the same region
// held (the agent keeps its grants in the region's store), valid on this
// clock until validUntil. A process that starts while the coordinator is
// unreachable so enforces what its region is counted for: the grant while
// it lasts, then the degraded budget falling back from it, for as long as
// the coordinator keeps that reserved. The grant is not presented on
// renewal (the coordinator knows it by the earlier process), renewal is due
// at once, and any grant of this process's own replaces it. A lease that
// already has a grant of its own ignores Restore.
func (a *Holder) Restore(g Grant, validUntil time.Time) {
	if a.grant.ID != "" && !a.restored {
		return
	}
	a.grant, a.grantSeq, a.validUntil = g, 0, validUntil
	a.sentAt = validUntil.Add(-a.timing.AgentValidFor())
	a.state, a.restored = Active, true
}

// Own reports whether this process holds a grant of its own (installed by
// Granted), expired or not.
func (a *Holder) Own() bool { return a.grant.ID != "" && !a.restored }

// Failed records that req got no grant. The installed grant, if any, stays
// valid until it expires. A refusal of the presented grant as stale or
// unknown makes the next request ask anew.
func (a *Holder) Failed(req Request, err error) {
	a.done()
	a.tried = true
	if errors.Is(err, ErrStaleGrant) || errors.Is(err, ErrUnknownGrant) {
		if a.present == req.GrantID {
			a.present = ""
		}
	}
	if a.state == Renewing && a.pending == 0 {
		a.state = Active
	}
}

func (a *Holder) done() {
	if a.pending > 0 {
		a.pending--
	}
}

// SetPolicy applies a changed policy's failure mode and total amount to
// the lease: the degraded budget from now on follows them. The installed
// grant stays (the coordinator counts it until it ends).
func (a *Holder) SetPolicy(f policy.Failure, total int64) {
	a.failure, a.total = f, total
}

// SetDegradedTimeout sets how long after a grant's end its degraded budget
// may be enforced: the coordinator's reservation, a term every grant
// carries. Zero leaves it unchanged.
func (a *Holder) SetDegradedTimeout(d time.Duration) {
	if d > 0 {
		a.timing.DegradedTimeout = d
	}
}

// RaiseDrift makes the lease assume clocks drift by up to d when d is more
// than it assumed: a coordinator that publishes its bound for a larger
// drift must not have agents trust grants longer than that allows.
func (a *Holder) RaiseDrift(d float64) {
	if d > a.timing.Drift {
		a.timing.Drift = d
	}
}

// RenewInterval is how long after sending a request the installed grant
// wants renewing (its RenewAfter, else a third of its validity); 0 before
// any grant.
func (a *Holder) RenewInterval() time.Duration {
	if a.grant.ID == "" || a.restored {
		return 0
	}
	if r := a.grant.RenewAfter; r > 0 && r < a.timing.AgentValidFor() {
		return r
	}
	return a.timing.RenewAfter()
}

// DegradedTimeout is how long after the grant's end its degraded budget is
// reserved (the coordinator's, once SetDegradedTimeout has passed it on).
func (a *Holder) DegradedTimeout() time.Duration { return a.timing.DegradedTimeout }

// Grant returns the installed grant (zero if none) and until when, on the
// agent's clock, it is valid.
func (a *Holder) Grant() (Grant, time.Time) { return a.grant, a.validUntil }

// State returns the lease state at now.
func (a *Holder) State(now time.Time) State {
	a.advance(now)
	if a.state == Requested && a.tried {
		return Degraded // following the failure mode with no last share
	}
	return a.state
}

// NeedsRenewal reports whether a renewal is due at now: no grant yet, or
// the grant's RenewAfter passed (by default a third of its validity).
func (a *Holder) NeedsRenewal(now time.Time) bool {
	at := a.RenewAt()
	return at.IsZero() || !now.Before(at)
}

// RenewAt is when a renewal falls due (NeedsRenewal); the zero time when
// it is due whatever the time: no grant yet, or a restored one.
func (a *Holder) RenewAt() time.Time {
	if a.grant.ID == "" || a.restored {
		return time.Time{}
	}
	return a.sentAt.Add(a.RenewInterval())
}

// Enforce returns the amount the region may enforce for identity at now
// ("" for one the grant gives no share of its own) and the mode: the grant's
// share while it is valid (Grant.AmountFor: the identity's own, else the
// default); once it may have expired, the policy's degraded budget falling
// back from that, for at most AgentDegradedFor; then nothing. A lease that
// never had a grant and whose first request failed follows its failure
// mode with no last share: fail-open enforces its open fraction (never
// reserved, counted by the bound); the others nothing, since a static
// share is reserved only for a region that held a lease.
func (a *Holder) Enforce(identity string, now time.Time) (int64, Mode) {
	a.advance(now)
	return a.enforceIn(a.state, identity, now)
}

// EnforceAt is what Enforce will return at a later time at, if no
// answer arrives before: the edge sizes assignments that outlive now by
// it. Unlike Enforce it changes nothing, so looking ahead past the
// grant's validity does not make the holder degraded now.
func (a *Holder) EnforceAt(identity string, at time.Time) (int64, Mode) {
	return a.enforceIn(a.stateAt(at), identity, at)
}

func (a *Holder) enforceIn(state State, identity string, now time.Time) (int64, Mode) {
	switch state {
	case Requested:
		if a.tried {
			return DegradedBudget(a.failure, a.total, 0, 0), ModeDegraded
		}
		return 0, ModeNone
	case Active, Renewing:
		return a.grant.AmountFor(identity), ModeLeased
	case Degraded:
		since := now.Sub(a.validUntil)
		// Measure the decay as if this clock were slow, so the agent's
		// budget never exceeds what the coordinator still reserves.
		since += a.timing.driftOf(since)
		return DegradedBudget(a.failure, a.grant.DegradedTotal(a.total), a.grant.AmountFor(identity), since), ModeDegraded
	default: // Expired
		return 0, ModeDegraded
	}
}

func (a *Holder) advance(now time.Time) { a.state = a.stateAt(now) }

// stateAt is the state at now, the grant's validity having run its course
// if now is past it.
func (a *Holder) stateAt(now time.Time) State {
	if a.grant.ID == "" || now.Before(a.validUntil) {
		return a.state
	}
	if now.Sub(a.validUntil) < a.timing.AgentDegradedFor() {
		return Degraded
	}
	return Expired
}
