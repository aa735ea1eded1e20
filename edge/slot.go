package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// Slot is one Envoy instance's bucket of a policy identity as an agent
// tracks it: the demand its reports show and the token bucket it was
// assigned.
type Slot struct {
	// Demand is the reported demand in the policy's amount unit; -1 while
	// unknown (a bucket's first report says nothing of its rate, nor
	// reports over less than firstSpan in all).
	Demand int64
	// perSecond is the request rate Demand stands for, once rated,
	// averaged over short reports (demandWindow); early and earlyFor are
	// the requests and the time of reports too short for a first rate
	// (firstSpan).
	perSecond float64
	rated     bool
	early     uint64
	earlyFor  time.Duration
	// At is when the last report came; Busy the last one with requests
	// (or the first).
	At, Busy time.Time
	// Bucket is the token bucket last assigned (zero: none or DENY_ALL),
	// Changed when it last changed.
	Bucket  tokens.Bucket
	Changed time.Time
	// Placed: the slot holds one of the places (instances) the region's
	// store granted this agent for the identity, and only then is
	// assigned (Key.Places). Refused: a sync found no place free for it;
	// it takes no part in the split and asks again with the key's next
	// write. Group names the host its instance runs on, as the agent sees
	// its stream: places are shared fairly between groups (Key.place).
	Placed, Refused bool
	Group           string

	// What tokens.Resize knows of the room between the share's virtual bucket
	// and Envoy's (slack, tokens) as of slackAt: it grows by withheld a
	// second while the instance may hold the bucket (until mayHold, the
	// last assignment's latest end), up to the share's burst less the
	// bucket's size, and by the share's rate once it holds none, up to the
	// burst (rate, burst: the last share's). A slot never sized has the
	// whole burst. heldUntil is until when the instance surely holds it.
	slack, withheld             float64
	rate, burst                 float64
	slackAt, heldUntil, mayHold time.Time
}

// Report takes a usage report of the slot received at now: count
// requests (allowed and denied) over elapsed, Envoy's time_elapsed. The
// rate is measured between the reports as they arrived when there was an
// earlier one (Span), the first over at least firstSpan, and reports over
// less than demandWindow are averaged. It returns the span the count is
// over (0: unknown), for the lease meter, which counts it as the region's
// demand.
func (s *Slot) Report(p *policy.Policy, count uint64, elapsed time.Duration, now time.Time) time.Duration {
	var measured time.Duration
	if !s.At.IsZero() {
		measured = now.Sub(s.At)
	}
	s.At = now
	if count > 0 {
		s.Busy = now
	}
	span, ok := Span(elapsed, measured)
	if !ok {
		return 0
	}
	last, d := s.perSecond, span
	if !s.rated {
		// A first rate over less than firstSpan says little (Envoy's
		// report timer may tick a few milliseconds after a bucket's first
		// report): it waits for the next report, which counts it too.
		count, d = count+s.early, d+s.earlyFor
		if d < firstSpan {
			s.early, s.earlyFor = count, d
			return span
		}
		s.early, s.earlyFor, s.rated, last = 0, 0, true, -1
	}
	s.perSecond = averaged(last, count, d)
	s.Demand = DemandAmount(p, s.perSecond)
	return span
}

// DirectCount is how many requests of p's cost direct checks that asked
// cost (micro-units) stand for, as Envoy's reports count them.
func DirectCount(p *policy.Policy, cost int64) uint64 {
	return uint64(max(0, math.Round(float64(cost)/(float64(p.Cost)*float64(policy.Micro)))))
}

// ReportedCost is the cost (micro-units) count reported requests of p
// stand for, capped far above any real report: the edge's demand is the
// region's too, so the agent's lease meter counts it as it counts direct
// checks', and the region's share follows the edge.
func ReportedCost(p *policy.Policy, count uint64) int64 {
	return int64(min(float64(count)*float64(p.Cost)*float64(policy.Micro), 1e18))
}
