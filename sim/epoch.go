package sim

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/policy"
)

// epoch is one stretch of a run under one policy: from the start, or from
// a config change, to the next change. Windows are attributed to the epoch
// in which they end; those ending within bound.TransitionSpan of its start
// are its transition (they may reach back into the previous policy, whose
// grants still count), the rest its steady part, judged against its own
// policy alone, so a lowered limit is never hidden behind a larger one.
type epoch struct {
	startMs      int64
	transitionMs int64 // end of the transition part (= startMs for the first epoch)
	policy, prev *policy.Policy
	bumped       bool
	// max[mode] is the most admitted for one identity in a window ending
	// in the steady part [0] or the transition [1], micro-units.
	max [][2]int64
}

// EpochResult is one epoch of one mode in summary.json.
type EpochResult struct {
	StartMs int64 `json:"start_ms"`
	EndMs   int64 `json:"end_ms"`
	// Limit is the policy's limit (units per period) in this epoch;
	// Reference what one ideal global limiter under it admits in a window.
	Limit     float64 `json:"limit"`
	Reference float64 `json:"reference"`
	// Bound is the mode's bound for the steady part's windows, MaxWindow
	// the most admitted in one of them, Overshoot how far that is above
	// Reference.
	Bound      float64            `json:"bound"`
	BoundTerms map[string]float64 `json:"bound_terms,omitempty"`
	MaxWindow  float64            `json:"max_window"`
	Overshoot  float64            `json:"overshoot"`
	// The transition: windows ending before TransitionEndMs, with their
	// reference (the larger of the two policies'), bound and most admitted.
	TransitionEndMs      int64              `json:"transition_end_ms,omitempty"`
	TransitionReference  float64            `json:"transition_reference,omitempty"`
	TransitionBound      float64            `json:"transition_bound,omitempty"`
	TransitionBoundTerms map[string]float64 `json:"transition_bound_terms,omitempty"`
	TransitionMaxWindow  float64            `json:"transition_max_window,omitempty"`
	TransitionOvershoot  float64            `json:"transition_overshoot,omitempty"`
	WithinBound          bool               `json:"within_bound"`
}

// beginEpoch starts a new epoch at the engine's now under p.
func (e *engine) beginEpoch(p *policy.Policy, bumped bool) {
	ep := &epoch{startMs: e.now, transitionMs: e.now, policy: p, bumped: bumped, max: make([][2]int64, len(systems)+1)}
	if n := len(e.epochs); n > 0 {
		ep.prev = e.epochs[n-1].policy
		ep.transitionMs = e.now + bound.TransitionSpan(e.deployment(), time.Duration(e.s.Window)).Milliseconds()
	}
	e.epochs = append(e.epochs, ep)
}

// observeWindow records that mode's window ending at atMs held sum.
func (e *engine) observeWindow(mode int, atMs, sum int64) {
	ep := e.epochs[len(e.epochs)-1]
	part := 0
	if atMs < ep.transitionMs {
		part = 1
	}
	ep.max[mode][part] = max(ep.max[mode][part], sum)
}

// epochResults judges every epoch of mode m (a bound.Mode kind) and
// returns them with the largest steady or transition overshoot and bound,
// and whether every window was within its bound.
func (e *engine) epochResults(
	mode int,
	kind bound.Mode,
) (out []EpochResult, overshoot, worst float64, within bool, err error) {
	w := time.Duration(e.s.Window)
	d := e.deployment()
	within = true
	end := time.Duration(e.s.Duration).Milliseconds()
	for i, ep := range e.epochs {
		r := EpochResult{StartMs: ep.startMs, EndMs: end, Limit: ep.policy.Limit, Reference: bound.Reference(ep.policy, w)}
		if i+1 < len(e.epochs) {
			r.EndMs = e.epochs[i+1].startMs
		}
		b, err := bound.Compute(ep.policy, d, kind, w)
		if err != nil {
			return nil, 0, 0, false, err
		}
		r.Bound, r.BoundTerms = b.WorstCase, b.Terms
		r.MaxWindow = policy.Units(ep.max[mode][0])
		r.Overshoot = math.Max(0, r.MaxWindow-r.Reference)
		r.WithinBound = r.MaxWindow <= b.WorstCase*(1+1e-9)
		overshoot, worst = math.Max(overshoot, r.Overshoot), math.Max(worst, b.WorstCase)
		if ep.prev != nil {
			tb, err := bound.Transition(ep.prev, ep.policy, ep.bumped, d, kind, w)
			if err != nil {
				return nil, 0, 0, false, err
			}
			r.TransitionEndMs = ep.transitionMs
			r.TransitionReference, r.TransitionBound, r.TransitionBoundTerms = tb.Limit, tb.WorstCase, tb.Terms
			r.TransitionMaxWindow = policy.Units(ep.max[mode][1])
			r.TransitionOvershoot = math.Max(0, r.TransitionMaxWindow-tb.Limit)
			r.WithinBound = r.WithinBound && r.TransitionMaxWindow <= tb.WorstCase*(1+1e-9)
			overshoot, worst = math.Max(overshoot, r.TransitionOvershoot), math.Max(worst, tb.WorstCase)
		}
		within = within && r.WithinBound
		out = append(out, r)
	}
	return out, overshoot, worst, within, nil
}
