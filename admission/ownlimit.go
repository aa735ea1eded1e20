package admission

import "fmt"

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
