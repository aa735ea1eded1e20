package admission

import (
	"fmt"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// Returns (Request.Return, Envoy's is_negative_hits) take the path of any
// request, with four differences, each written here or marked where it is
// taken:
//
//   - only a policy that accepts returns (policy.Policy.Returns) takes
//     them: a batch holding a return to any other is refused whole
//     (refuseReturns), as its caller asked for the requests together;
//   - a return needs a share, not one that holds its cost (checkCost): it
//     only frees, and may give back more than a share holds now;
//   - the in-process fallback takes no returns: a return the store cannot
//     decide is dropped, nothing matched (dropReturn), so the units stay
//     counted until they leave the window or are refilled, and a return
//     is never applied twice;
//   - the over-limit cache is not used for a policy that accepts returns
//     (Ticket.cachesRejections): a return through any instance may free
//     what a cached rejection says is taken, and the store must record
//     every refusal, which the refused request's return is matched
//     against (policy.ApplyHeld).
//
// A keyed return is replayed like a keyed charge, apart from the charge
// it returns (Resolve), so a retried return frees nothing again.

// MaxReturnUnits bounds the units one return gives back: a capacity's
// worth, the most any state counts.
const MaxReturnUnits = policy.MaxCapacity / policy.Micro

// refuseReturns refuses every request of rs, in out, if one of them is a
// return to a policy that does not accept returns, or a return with its
// own limit, and reports whether it did. A return naming no loaded policy
// is left to prepare (ErrUnknownPolicy, for that request alone).
func (p *Pipeline) refuseReturns(rs []Request, out []Result) bool {
	for i, r := range rs {
		if !r.Return {
			continue
		}
		pol, ok := p.cfg.Policies.Policy(r.Policy)
		if !ok || pol.Returns && r.Limit == nil {
			continue
		}
		err := fmt.Errorf("request %d of %d: %w", i+1, len(rs), refusedReturn(pol, r))
		for j := range out {
			out[j].Err = err
		}
		return true
	}
	return false
}

// refusedReturn is why return r to p (which does not accept it) is refused.
func refusedReturn(p *policy.Policy, r Request) error {
	if r.Limit != nil {
		return fmt.Errorf("%w: policy %q: a return carries no limit of its own", ErrReturnRefused, p.Name)
	}
	return fmt.Errorf("%w: policy %q does not accept returns: a return to a rate limit would admit more than "+
		"the limit (a policy declares returns: true where a returned request is over)",
		ErrReturnRefused, p.Name)
}

// checkCost reports why limits l of policy p can never decide a request of
// cost whole units: for a charge, CheckCapacity; for a return, limits
// that are not valid or a cost above MaxReturnUnits.
func checkCost(p *policy.Policy, l policy.Limits, cost int64, isReturn bool) error {
	if !isReturn {
		return CheckCapacity(p, l, cost)
	}
	if err := p.ShardLimits(l).Validate(); err != nil {
		return err
	}
	if cost > MaxReturnUnits {
		return fmt.Errorf("%w: a return of %d units, more than %d", policy.ErrInvalidCost, cost, MaxReturnUnits)
	}
	return nil
}

// dropReturn answers return t without deciding it, nothing matched: it had
// no share, or the store could not decide it.
func (p *Pipeline) dropReturn(t *Ticket, mode lease.Mode, via Via) Outcome {
	return p.finish(t, policy.Decision{Allowed: true}, mode, via)
}

// cachesRejections reports whether t's rejection may be remembered, and t
// answered from the over-limit cache: a keyed request is recorded by the
// store instead, a policy that accepts returns has rejections a return
// may lift at any moment, each of which the store records, and a charge
// after the fact (policy.Limits.PostHoc) is counted even when refused, so
// only the store can take it (the checks of such a policy are cached).
func (t *Ticket) cachesRejections() bool {
	return t.replayKey == "" && !t.Policy.Returns && (t.Cost == 0 || !t.Limits.PostHoc)
}
