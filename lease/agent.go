package lease

import (
	"errors"
	"time"

	"github.com/quota-lease/quota-lease/regional"
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

// Mode is how an agent decides while in a state: on its leased share, on its
// degraded budget, or with nothing at all.
type Mode string

// The enforcement modes an agent reports with every decision.
const (
	ModeLeased   Mode = "leased"
	ModeDegraded Mode = "degraded"
	ModeNone     Mode = "unleased"
)

// Agent is one quota's lease as a regional agent process holds it. It is
// not safe for concurrent use; the agent guards it.
type Agent struct {
	timing  Timing
	failure regional.Failure
	total   int64

	state      State
	grant      Grant     // the grant being enforced
	grantSeq   uint64    // the request it answered
	sentAt     time.Time // that request's send time
	validUntil time.Time // agent clock: sentAt + AgentValidFor
	present    string    // grant id to present on the next request
	seq        uint64
	pending    int // requests in flight
}

// Request is one lease request an Agent is about to send.
type Request struct {
	// Seq numbers the request; answers to older requests than the
	// installed grant's are ignored.
	Seq uint64
	// GrantID is the grant to present (and so acknowledge), or "".
	GrantID string
	// SentAt is the agent's clock when it sends; validity counts from it.
	SentAt time.Time
}

// NewAgent returns a lease in state requested for a quota of total amount
// with failure policy f.
func NewAgent(t Timing, f regional.Failure, total int64) *Agent {
	return &Agent{timing: t, failure: f, total: total, state: Requested}
}

// Sending returns the request to send at now. Its answer goes to Granted
// or Failed.
func (a *Agent) Sending(now time.Time) Request {
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
func (a *Agent) Granted(req Request, g Grant) {
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
}

// Failed records that req got no grant. The installed grant, if any, stays
// valid until it expires. A refusal of the presented grant as stale or
// unknown makes the next request ask anew.
func (a *Agent) Failed(req Request, err error) {
	a.done()
	if errors.Is(err, ErrStaleGrant) || errors.Is(err, ErrUnknownGrant) {
		if a.present == req.GrantID {
			a.present = ""
		}
	}
	if a.state == Renewing && a.pending == 0 {
		a.state = Active
	}
}

func (a *Agent) done() {
	if a.pending > 0 {
		a.pending--
	}
}

// SetPolicy applies a changed policy's failure mode and total amount to
// the lease: the degraded budget from now on follows them. The installed
// grant stays (the coordinator counts it until it ends).
func (a *Agent) SetPolicy(f regional.Failure, total int64) {
	a.failure, a.total = f, total
}

// LimitDegraded caps how long the degraded budget is enforced, to the
// coordinator's reservation time handed out with grants.
func (a *Agent) LimitDegraded(d time.Duration) {
	if d > 0 && d < a.timing.DegradedTimeout {
		a.timing.DegradedTimeout = d
	}
}

// Grant returns the installed grant (zero if none) and until when, on the
// agent's clock, it is valid.
func (a *Agent) Grant() (Grant, time.Time) { return a.grant, a.validUntil }

// State returns the lease state at now.
func (a *Agent) State(now time.Time) State {
	a.advance(now)
	return a.state
}

// NeedsRenewal reports whether a renewal is due at now: no grant yet, or a
// third of its validity gone.
func (a *Agent) NeedsRenewal(now time.Time) bool {
	if a.grant.ID == "" {
		return true
	}
	return !now.Before(a.sentAt.Add(a.timing.RenewAfter()))
}

// Enforce returns the amount the region may enforce at now and the mode:
// the grant while it is valid; once it may have expired, the policy's
// degraded budget for at most AgentDegradedFor; then nothing.
func (a *Agent) Enforce(now time.Time) (int64, Mode) {
	a.advance(now)
	switch a.state {
	case Active, Renewing:
		return a.grant.Amount, ModeLeased
	case Degraded:
		since := now.Sub(a.validUntil)
		// Measure the decay as if this clock were slow, so the agent's
		// budget never exceeds what the coordinator still reserves.
		since += a.timing.driftOf(since)
		return DegradedBudget(a.failure, a.total, a.grant.Amount, since), ModeDegraded
	case Expired:
		return 0, ModeDegraded
	default:
		return 0, ModeNone
	}
}

func (a *Agent) advance(now time.Time) {
	if a.grant.ID == "" || now.Before(a.validUntil) {
		return
	}
	if now.Sub(a.validUntil) < a.timing.AgentDegradedFor() {
		a.state = Degraded
	} else {
		a.state = Expired
	}
}
