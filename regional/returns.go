package regional

import (
	"strings"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Returns (admission.Request.Return, Envoy's is_negative_hits): a policy
// that accepts them (policy.Policy.Returns) keeps a ledger of the units
// each identity holds, admitted and not yet returned, in its state's hash,
// and a return frees what policy.Return says. Both are decisions of the
// one decision script (lua/returns.lua), told apart by their code.

// heldCodes and returnCodes name a charge of a policy that accepts
// returns (recorded in the ledger when admitted) and a return, in
// decideScript's arguments.
var heldCodes, returnCodes = codesWith("+"), codesWith("-")

// postHocCodes name a charge of a policy that takes charges after the
// fact (policy.Limits.PostHoc): counted whether or not it fits.
var postHocCodes = codesWith("!")

// reserveCodes and settleCodes name a reservation and its settlement
// (admission.Request.Reserve and Settle; lua/reservation.lua).
var reserveCodes, settleCodes = codesWith("^"), codesWith("=")

func codesWith(suffix string) map[policy.Algorithm]any {
	m := make(map[policy.Algorithm]any, len(algorithmCodes))
	for a, c := range algorithmCodes {
		m[a] = c.(string) + suffix
	}
	return m
}

// decisionCode is the code t is decided with under limits l.
func decisionCode(t *admission.Ticket, l policy.Limits) any {
	switch {
	case t.Reserve:
		return reserveCodes[l.Algorithm]
	case t.Estimate > 0:
		return settleCodes[l.Algorithm]
	case t.Return:
		return returnCodes[l.Algorithm]
	case t.Policy.Returns:
		return heldCodes[l.Algorithm]
	case l.PostHoc:
		return postHocCodes[l.Algorithm]
	}
	return algorithmCodes[l.Algorithm]
}

// ticketIdempotencyKey is the key remembering t's decision: a return's
// and a settlement's apart from a charge's (or reservation's), so that a
// request returning or settling what it took under the same idempotency
// key is not answered with its charge's decision.
func ticketIdempotencyKey(stateKey string, t *admission.Ticket) string {
	var kind string
	switch {
	case t.Return:
		kind = ":r:"
	case t.Estimate > 0:
		kind = ":s:"
	default:
		return idempotencyKey(stateKey, t.IdempotencyKey)
	}
	var b strings.Builder
	b.WriteString(stateKey)
	b.WriteString(kind)
	policy.Escape(&b, t.IdempotencyKey)
	return b.String()
}
