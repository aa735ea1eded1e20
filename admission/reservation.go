package admission

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"

	"github.com/quota-lease/quota-lease/policy"
)

// Reservations (policy/reservation.go says what they count): a request of
// a policy that takes charges after the fact reserves its estimated cost
// when it starts (Request.Reserve) and settles its actual cost when it
// ends (Request.Settle). A reservation's name is "<estimate>.<key>": the
// units it reserved and the idempotency key it was decided under, which
// the store keeps its record by. The settlement deletes the record and
// charges or gives back the difference; when the record is gone (expired,
// or another region's store), the store charges what the actual cost
// exceeds the named estimate by, and gives nothing back: a caller that
// misstates the estimate can only fail to be charged what it could have
// avoided by never settling.

// reservationName is the name of the reservation of estimate units under
// idempotency key key.
func reservationName(estimate int64, key string) string {
	return strconv.FormatInt(estimate, 10) + "." + key
}

// parseReservation splits a reservation's name into its estimate and key.
func parseReservation(name string) (estimate int64, key string, err error) {
	e, key, ok := strings.Cut(name, ".")
	ok = ok && e != "" && e[0] != '0' && strings.Trim(e, "0123456789") == "" // digits, as reservationName writes them
	if ok {
		estimate, err = strconv.ParseInt(e, 10, 64)
	}
	if !ok || err != nil || estimate < 1 || estimate > policy.MaxCapacity/policy.Micro {
		return 0, "", fmt.Errorf("%w: %q names no reservation: want <estimate>.<key>, as a reservation's answer "+
			"gave it", ErrInvalidRequest, name)
	}
	if err := ValidIdempotencyKey(key); err != nil || key == "" {
		return 0, "", fmt.Errorf("%w: reservation %q: its key must be printable ASCII without spaces, 1 to %d "+
			"bytes", ErrInvalidRequest, name, MaxIdempotencyKeyBytes)
	}
	return estimate, key, nil
}

// newReservationKey is the key of a reservation its caller named none
// for: 26 random characters.
func newReservationKey() string { return rand.Text() }

// resolveReservation validates the reservation or settlement r asks of p
// and fills in t's: a reservation is a charge that must fit (limits that
// do not count charges after the fact), under its key; a settlement
// carries its reservation's estimate and key, and any cost from 0 up.
func resolveReservation(p *policy.Policy, r Request, t *Ticket) error {
	switch {
	case !p.PostHoc:
		return fmt.Errorf("%w: policy %q: reservations are for costs known after the fact; the policy needs "+
			"post_hoc: true", ErrInvalidRequest, p.Name)
	case r.Reserve && r.Settle != "" || r.Check || r.Return || r.Limit != nil:
		return fmt.Errorf("%w: policy %q: a reservation or settlement is neither a check, a return, the other, "+
			"nor under a limit of its own", ErrInvalidRequest, p.Name)
	}
	if r.Reserve {
		t.Reserve, t.IdempotencyKey, t.Limits.PostHoc = true, r.IdempotencyKey, false
		if t.IdempotencyKey == "" {
			t.IdempotencyKey = newReservationKey()
		}
		return nil
	}
	estimate, key, err := parseReservation(r.Settle)
	if err != nil {
		return fmt.Errorf("policy %q: %w", p.Name, err)
	}
	if r.IdempotencyKey != "" && r.IdempotencyKey != key {
		return fmt.Errorf("%w: policy %q: a settlement is keyed by its reservation; drop idempotency_key",
			ErrInvalidRequest, p.Name)
	}
	t.Estimate, t.IdempotencyKey = estimate, key
	return nil
}

// Charged is what t charges, in whole units, beyond what a reservation
// already counted: a settlement's actual cost less its estimate (0 when
// it gives back), any other ticket's cost. It is what a demand meter and
// the local fallback (which holds no reservation) take from a settlement.
func (t *Ticket) Charged() int64 {
	if t.Estimate > 0 {
		return max(0, t.Cost-t.Estimate)
	}
	return t.Cost
}

// Reservation is the name of the reservation t made, or "".
func (t *Ticket) Reservation() string {
	if !t.Reserve {
		return ""
	}
	return reservationName(t.Cost, t.IdempotencyKey)
}
