package regional

import (
	"context"
	"strings"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Reservations (admission/reservation.go): a reservation is a charge that
// must fit, decided under its key with the engine's ReservationTTL as its
// idempotency window, so that its idempotency record, which the script
// extends with what it reserved and when, lives as long as it waits. A
// settlement reads and deletes that record in the same script run
// (lua/reservation.lua) and remembers its own answer under a key apart
// (ticketIdempotencyKey).

// noReservation is the script's reason for a settlement whose record is
// gone: never made, settled already, expired, or in another store.
const noReservation = "ERR no reservation"

// settleUnrecorded decides again the settlements among ts (out[i] is
// ts[i]'s result) whose reservation the store no longer holds: as charges
// after the fact of what the actual cost exceeds the named estimate by,
// nothing given back, remembered under the settlement's key; one that
// exceeds nothing is admitted, with what a check finds left, and nothing
// to remember. One more round trip, for a settlement that came too late
// or to another region.
func (e *Engine) settleUnrecorded(ctx context.Context, ts []*admission.Ticket, out []Result) {
	var ds []decision
	var idx []int
	for i, t := range ts {
		if t.Estimate == 0 || out[i].Err == nil || !strings.Contains(out[i].Err.Error(), noReservation) {
			continue
		}
		d, err := e.prepare(t)
		if err != nil {
			continue // prepared once already: cannot fail now
		}
		rec := len(d.keys) - 2 // the record's key, before the settlement's own
		d.keys = append(d.keys[:rec:rec], d.keys[rec+1])
		if t.Charged() == 0 {
			d.keys, d.args[1] = d.keys[:rec], int64(0)
		}
		d.args[0] = postHocCodes[d.alg]
		d.args[4] = t.Charged() * policy.Micro
		d.cost = t.Charged() * policy.Micro
		ds, idx = append(ds, d), append(idx, i)
	}
	if len(ds) == 0 {
		return
	}
	for j, res := range e.decideScripts(ctx, ds) {
		i := idx[j]
		out[i] = result(ds[j], res)
		if ts[i].Charged() == 0 && out[i].Err == nil { // nothing to charge: settled
			out[i].Decision.Allowed, out[i].Decision.RetryAfterMs = true, 0
		}
	}
}
