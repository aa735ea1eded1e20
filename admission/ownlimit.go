package admission

import (
	"fmt"
	"time"

	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/scale"
)

// prepareOwn resolves r, which carries its own limit, under that limit
// (policy.UnderOwnLimit). The own limit of a global policy is global too:
// the region enforces the same fraction of it as its lease gives it of
// the policy (the share, or the degraded budget), so that the regions
// together never admit more than the own limit and the policy's bound
// holds for it as for the policy; a region-scoped policy's is enforced
// whole.
func (p *Pipeline) prepareOwn(pol *policy.Policy, r Request, now time.Time) (Ticket, error) {
	if r.Limit.Limit == 0 {
		return Ticket{}, fmt.Errorf("policy %q: %w: its request's own limit is 0", pol.Name, policy.ErrCostExceedsCapacity)
	}
	own := pol.UnderOwnLimit(*r.Limit)
	t, err := Resolve(own, r, own.Limits())
	if err != nil || pol.Scope == policy.ScopeRegion || p.cfg.Shares == nil {
		return t, err
	}
	amount, mode := p.cfg.Shares.Enforce(pol.Name, t.Identity, now)
	t.Enforce(scaleAmount(amount, pol.Limits().Amount(), own.Limits().Amount()), mode)
	return t, nil
}

// scaleAmount is amount, a share of a limit whose whole is of, as the
// same fraction of to, rounded down.
func scaleAmount(amount, of, to int64) int64 {
	if amount <= 0 || of <= 0 || to <= 0 {
		return 0
	}
	return scale.Down(min(amount, of), to, of)
}

// refuseOwnLimits validates the own limits of a batch's requests
// (Request.Limit) before anything of it is decided: if one cannot be
// enforced, every request of the batch is refused with an error wrapping
// policy.ErrInvalidOwnLimit that names it, and refuseOwnLimits reports
// true. A batch is refused whole because its caller asked for the
// requests together (an Envoy call's descriptors): answering some and
// not others would charge part of what was asked, for an answer the
// caller cannot use.
func refuseOwnLimits(rs []Request, out []Result) bool {
	for i, r := range rs {
		if r.Limit == nil {
			continue
		}
		if err := r.Limit.Validate(); err != nil {
			err = fmt.Errorf("request %d of %d (policy %q): %w", i+1, len(rs), r.Policy, err)
			for j := range out {
				out[j].Err = err
			}
			return true
		}
	}
	return false
}
