package admission

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// Errors for requests refused before any state is touched. Every entry
// point maps them to its wire's "bad request" (HTTP 400, gRPC
// InvalidArgument); nothing is charged.
var (
	// ErrUnknownPolicy reports a request naming no loaded policy.
	ErrUnknownPolicy = errors.New("unknown policy")
	// ErrInvalidRequest reports a malformed request.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrReturnRefused reports a return (Request.Return) to a policy that
	// does not accept returns (policy.Policy.Returns), or one that carries
	// its own limit.
	ErrReturnRefused = errors.New("return refused")
)

// MaxIdempotencyKeyBytes bounds an idempotency key.
const MaxIdempotencyKeyBytes = 128

// NoShareRetryMs is the retry delay of a request refused because the
// limits it may be enforced under cannot hold it (no share, a share too
// small for its cost): roughly until the next lease round.
const NoShareRetryMs = 1000

// Request is one check as a caller asks it. Every entry point (HTTP, gRPC,
// Envoy, the simulator) turns its own form into a Request.
type Request struct {
	// Policy names the policy to enforce.
	Policy string
	// Attributes are the request's attributes; the policy's identity picks
	// the ones it counts by.
	Attributes map[string]string
	// Cost in whole units; 0 means the policy's default.
	Cost int64
	// Check asks whether the identity is within its limit without
	// charging anything (Envoy's hits_addend 0, sent before a request
	// whose cost is known only when it ends): a charge of 0, admitted
	// until the identity's usage exceeds its limit. Cost must be 0.
	Check bool
	// IdempotencyKey, when set, makes a retried request get the decision
	// already made for it, uncharged.
	IdempotencyKey string
	// Limit, when set, is the request's own limit (Envoy's descriptor
	// limit override): it is decided under Policy.UnderOwnLimit(*Limit)
	// instead of under the policy's limits; for a global policy, the
	// fraction of it the region's lease gives of the policy. A batch
	// holding a Limit that cannot be enforced (policy.ErrInvalidOwnLimit)
	// is refused whole, before anything is decided or charged; a Limit
	// of 0 refuses its request as more than the limit holds.
	Limit *policy.OwnLimit
	// Return gives back Cost units a request of the same identity took
	// (Envoy's is_negative_hits) instead of taking them: decided by
	// policy.Return, it matches what the identity holds and frees what
	// the limit still counts of it, and is never refused by the limit. A
	// batch holding a return to a policy that does not accept returns
	// (policy.Policy.Returns), or a return with a Limit, is refused whole
	// (ErrReturnRefused), before anything is decided or charged.
	Return bool
	// Reserve makes the request a reservation of Cost units, its
	// estimated cost, under a policy that takes charges after the fact
	// (reservation.go): admitted only if that fits, counted only when
	// admitted, and named in the outcome (Outcome.Reservation) for the
	// request's settlement. IdempotencyKey, when set, names it too (a
	// retried reservation is answered again); else a random key does.
	Reserve bool
	// Settle names the reservation (an Outcome.Reservation) this request
	// settles with Cost, its actual cost, 0 or more: what it exceeds the
	// estimate by is charged, counted whether or not it fits; what it
	// falls short by is given back. Settled once: a retry is answered
	// again.
	Settle string
}

// Ticket is a request resolved against its policy: validated once, with
// the identity it counts against and the limits it is enforced under.
// Stores decide tickets as they are; nothing downstream validates again.
type Ticket struct {
	Policy *policy.Policy
	// Identity is whom the request counts against (policy.IdentityOf).
	Identity string
	// Cost in whole units: 0 for a check (Request.Check); else at least 1
	// and within the policy's capacity, or for a policy that takes charges
	// after the fact (policy.Policy.PostHoc) any cost up to
	// policy.MaxCapacity's units.
	Cost int64
	// IdempotencyKey as asked (valid), or "".
	IdempotencyKey string
	// Limits enforced: the region's share for a global policy (or its
	// degraded budget), the full limits otherwise; before a sharded
	// policy splits them (policy.Policy.ShardLimits).
	Limits policy.Limits
	// Mode the limits come from.
	Mode lease.Mode
	// Return: the ticket gives Cost back (Request.Return).
	Return bool
	// Reserve: the ticket is a reservation (Request.Reserve) under
	// IdempotencyKey, enforced under Limits that count only what fits.
	Reserve bool
	// Estimate is, for a settlement (Request.Settle), the units its
	// reservation named, and IdempotencyKey the reservation's key; 0 for
	// any other ticket.
	Estimate int64

	key       string // policy and identity: the identity's key in in-process tables (tableKey)
	replayKey string // key and idempotency key, or ""
	noShare   bool   // Limits cannot hold Cost: refused without asking the store
}

// Resolve validates r under p with limits l (p.Limits(), unless a caller
// enforces others of p's algorithm) and returns its ticket, enforced under
// l in region mode until Enforce narrows it. A refused request gets an
// error wrapping ErrInvalidRequest, ErrUnknownPolicy or a policy
// sentinel; it touches nothing.
func Resolve(p *policy.Policy, r Request, l policy.Limits) (Ticket, error) {
	if p.Envoy != nil && p.Envoy.Unlimited {
		return Ticket{}, fmt.Errorf("%w: policy %q is an unlimited Envoy descriptor: it limits nothing",
			ErrUnknownPolicy, p.Name)
	}
	if r.Return && (!p.Returns || r.Limit != nil) {
		return Ticket{}, refusedReturn(p, r)
	}
	if r.Check && (r.Return || r.Cost != 0) {
		return Ticket{}, fmt.Errorf("%w: policy %q: a check charges nothing: it carries no cost and returns "+
			"nothing", ErrInvalidRequest, p.Name)
	}
	settles := r.Settle != ""
	cost := r.Cost
	if cost == 0 && !r.Check && !settles {
		cost = p.Cost
	}
	if cost < 0 || cost == 0 && !r.Check && !settles {
		return Ticket{}, fmt.Errorf("policy %q: %w, got %d", p.Name, policy.ErrInvalidCost, cost)
	}
	if r.IdempotencyKey != "" {
		if err := ValidIdempotencyKey(r.IdempotencyKey); err != nil {
			return Ticket{}, fmt.Errorf("policy %q: %w", p.Name, err)
		}
	}
	t := Ticket{
		Policy:         p,
		Cost:           cost,
		Limits:         l,
		Mode:           lease.ModeRegion,
		Return:         r.Return,
		IdempotencyKey: r.IdempotencyKey,
	}
	if r.Reserve || settles {
		if err := resolveReservation(p, r, &t); err != nil {
			return Ticket{}, err
		}
	}
	if err := checkCost(p, t.Limits, cost, r.Return); err != nil {
		return Ticket{}, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	id, err := p.IdentityOf(r.Attributes)
	if err != nil {
		return Ticket{}, fmt.Errorf("policy %q: %w", p.Name, err)
	}
	t.Identity = id
	if t.IdempotencyKey != "" {
		t.replayKey = t.tableKey() + "\x00" + t.IdempotencyKey
		switch {
		case r.Return: // apart from the charge it returns, which may carry the same key
			t.replayKey += "\x00return"
		case settles: // apart from the reservation it settles
			t.replayKey += "\x00settle"
		}
	}
	return t, nil
}

// tableKey is t's identity's key in the pipeline's in-process tables (the
// over-limit cache, the fallback), built when first needed.
func (t *Ticket) tableKey() string {
	if t.key == "" {
		t.key = t.Policy.Name + "\x00" + t.Identity
	}
	return t.key
}

// Enforce puts t under the share of amount its region may enforce, which
// came from mode: when that share cannot hold t's cost (none at all, or too
// small: CheckCapacity), t is refused without asking the store, with
// NoShareRetryMs, and keeps its limits for the answer. A return needs
// only a share (checkCost); with none it is dropped, freeing nothing. A
// charge after the fact (a post-hoc policy's cost) is for a request a
// check already admitted: without a share it goes to the store under the
// least limits (policy.Limits.Least), refused there and still counted.
func (t *Ticket) Enforce(amount int64, mode lease.Mode) {
	t.Mode = mode
	l, ok := t.Limits.Share(amount)
	if !ok && t.Limits.PostHoc && (t.Cost > 0 || t.Estimate > 0) && !t.Return {
		l, ok = t.Limits.Least(), true
	}
	t.noShare = !ok || checkCost(t.Policy, l, t.Cost, t.Return) != nil
	if !t.noShare {
		t.Limits = l
	}
}

// CheckCapacity reports why limits l of policy p can never admit a request
// of cost whole units, or nil if they can: they are valid and each of p's
// shards holds the cost. It is the one rule deciding whether the full
// limit, a region's share or its degraded budget admits a cost; the local
// fallback, which has no shards, applies it to its part of the share whole
// (holds).
func CheckCapacity(p *policy.Policy, l policy.Limits, cost int64) error {
	if err := holds(p.ShardLimits(l), cost); err != nil {
		if n := p.ShardCount(); n > 1 {
			return fmt.Errorf("%w, one of %d shards", err, n)
		}
		return err
	}
	return nil
}

// holds reports why limits l can never decide cost whole units, or nil:
// invalid limits, a cost above the capacity (unless l counts charges after
// the fact, which counts such a charge and refuses it), or above the
// largest capacity (policy.Limits.CheckCost).
func holds(l policy.Limits, cost int64) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if cost > l.Capacity/policy.Micro && !l.PostHoc {
		return fmt.Errorf("%w (cost %d, capacity %s)", policy.ErrCostExceedsCapacity, cost, formatUnits(l.Capacity))
	}
	if cost > policy.MaxCapacity/policy.Micro {
		return fmt.Errorf("%w: %d units, more than %d", policy.ErrInvalidCost, cost, policy.MaxCapacity/policy.Micro)
	}
	return nil
}

// ValidIdempotencyKey reports, wrapping ErrInvalidRequest, an idempotency
// key that is not 1-128 printable ASCII characters without spaces.
func ValidIdempotencyKey(idem string) error {
	if len(idem) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: idempotency key is %d bytes, more than %d",
			ErrInvalidRequest, len(idem), MaxIdempotencyKeyBytes)
	}
	for i := 0; i < len(idem); i++ {
		if c := idem[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: idempotency key must be printable ASCII without spaces", ErrInvalidRequest)
		}
	}
	return nil
}

// IsInputError reports whether err refuses a request for what it asked
// (an unknown policy, a bad cost, identity or key), as opposed to a store
// that failed to decide it.
func IsInputError(err error) bool {
	for _, e := range []error{
		ErrUnknownPolicy, ErrInvalidRequest, ErrReturnRefused,
		policy.ErrInvalidCost, policy.ErrCostExceedsCapacity, policy.ErrInvalidIdentity,
		policy.ErrInvalidLimits, policy.ErrInvalidOwnLimit,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// formatUnits prints micro-units as units, without trailing zeros.
func formatUnits(micro int64) string {
	s := strconv.FormatFloat(policy.Units(micro), 'f', 6, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
