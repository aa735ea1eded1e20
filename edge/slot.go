package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Slot is one Envoy instance's bucket of a policy identity as an agent
// tracks it: the demand its reports show and the token bucket it was
// assigned.
type Slot struct {
	// Demand is the reported demand in the policy's amount unit; -1 while
	// unknown (a bucket's first report says nothing of its rate).
	Demand int64
	// At is when the last report came; Busy the last one with requests
	// (or the first).
	At, Busy time.Time
	// Bucket is the token bucket last assigned (zero: none or DENY_ALL),
	// Changed when it last changed.
	Bucket  Bucket
	Changed time.Time
	// Placed: the slot holds one of the places (instances) the region's
	// store granted this agent for the identity, and only then is
	// assigned (Key.Places). Refused: a sync found no place free for it;
	// it takes no part in the split and asks again with the key's next
	// write.
	Placed, Refused bool

	// What Resize knows of the room between the share's virtual bucket
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

// refill brings the slot's slack up to now.
func (s *Slot) refill(now time.Time) {
	if s.slackAt.IsZero() {
		s.slack, s.slackAt = math.Inf(1), now // a new slot: Resize caps it at the burst
		return
	}
	if t := minTime(now, s.mayHold).Sub(s.slackAt); t > 0 {
		s.slack = max(s.slack, min(s.slack+s.withheld*t.Seconds(), s.burst-float64(s.Bucket.MaxTokens)))
	}
	if t := now.Sub(maxTime(s.slackAt, s.mayHold)); t > 0 {
		s.slack = max(s.slack, min(s.slack+s.rate*t.Seconds(), s.burst))
	}
	s.slackAt = now
}

// resize gives the slot its bucket for share of p at now (Assign, or
// Resize when Envoy keeps a replaced bucket's fill): the bucket it holds
// counts as held only if surely still held when the change reaches it,
// margin after now.
func (s *Slot) resize(now time.Time, p *policy.Policy, share int64, cfg Config) {
	sh := ShapeOf(p, share)
	if !cfg.KeepsFill || sh.Log {
		s.Bucket = Assign(sh, cfg.ChangeEvery, cfg.BurstFraction, s.Bucket)
		return
	}
	s.refill(now)
	held := s.Bucket
	if !s.surelyHeld(now, cfg.Margin) {
		held = Bucket{}
	}
	b, slack, w := Resize(sh, held, s.slack, cfg.RepayOver, cfg.BurstFraction, s.Bucket, fallback(p))
	s.size(sh, b, slack, w)
}

// surelyHeld reports whether the instance surely still holds the slot's
// token bucket when a message sent at now reaches it, margin later.
func (s *Slot) surelyHeld(now time.Time, margin time.Duration) bool {
	return !s.Bucket.Deny() && now.Add(margin).Before(s.heldUntil)
}

// size takes Resize's answer for a share of shape sh: the slack grows at
// the new bucket's withheld refill (none under DENY_ALL, which refills
// nothing) and toward the new share's virtual bucket.
func (s *Slot) size(sh Shape, b Bucket, slack, withheld float64) {
	s.Bucket, s.slack, s.withheld = b, slack, withheld
	s.rate, s.burst = sh.Rate, sh.Burst
}

// grow gives the slot, refreshing an assignment of share of p, a larger
// bucket when its slack now covers one (Resize), and reports whether it
// did: a bucket sized while its slack was short, or while its share was
// smaller, grows once it may, and DENY_ALL sent for want of slack starts a
// bucket once there is. A token bucket grows only while surely held (or
// growing would be a start).
func (s *Slot) grow(now time.Time, p *policy.Policy, share int64, cfg Config) bool {
	if !s.Bucket.Deny() && !s.surelyHeld(now, cfg.Margin) {
		return false
	}
	s.refill(now)
	sh := ShapeOf(p, share)
	b, slack, w := Resize(sh, s.Bucket, s.slack, cfg.RepayOver, cfg.BurstFraction, fallback(p))
	if b.MaxTokens <= s.Bucket.MaxTokens {
		return false
	}
	s.size(sh, b, slack, w)
	return true
}

// refresh readies the slot's bucket to be sent again for share of p at
// now, and reports whether it changed: with Envoy's fill-ratio rule, a
// bucket that may have expired by the time the refresh arrives is sized
// as a start (it would start full), and one held is grown once its slack
// allows (grow), at most once per ChangeEvery.
func (s *Slot) refresh(now time.Time, p *policy.Policy, share int64, cfg Config) bool {
	switch {
	case !cfg.KeepsFill:
		return false
	case !s.Bucket.Deny() && !s.surelyHeld(now, cfg.Margin):
		s.resize(now, p, share, cfg)
		return true
	case now.Sub(s.Changed) >= cfg.ChangeEvery:
		return s.grow(now, p, share, cfg)
	}
	return false
}

// fallback is the token bucket p's Envoy instances fall back to once an
// assignment expired (zero when none): a bucket sent then must differ from
// it in more than its interval (bucketOf).
func fallback(p *policy.Policy) Bucket {
	if p.Edge == nil || p.Edge.Expired.Rule != policy.EdgeTokenBucket {
		return Bucket{}
	}
	x := p.Edge.Expired
	return Bucket{MaxTokens: x.MaxTokens, TokensPerFill: x.TokensPerSecond, FillInterval: time.Second}
}

// pushed notes that the slot's bucket was sent: the instance surely
// holds it until from, and may until end. DENY_ALL holds no tokens, but
// the bucket it replaces may be used until its own end.
func (s *Slot) pushed(from, end time.Time) {
	if s.Bucket.Deny() {
		s.heldUntil = time.Time{}
		return
	}
	s.heldUntil, s.mayHold = from, end
}

// Report takes a usage report of the slot received at now: count
// requests (allowed and denied) over elapsed, Envoy's time_elapsed. The
// rate is measured between the reports as they arrived when there was an
// earlier one (Rate).
func (s *Slot) Report(p *policy.Policy, count uint64, elapsed time.Duration, now time.Time) {
	var measured time.Duration
	if !s.At.IsZero() {
		measured = now.Sub(s.At)
	}
	if r, ok := Rate(count, elapsed, measured); ok {
		s.Demand = DemandAmount(p, r)
	}
	s.At = now
	if count > 0 {
		s.Busy = now
	}
}

// DirectDemand is the demand of direct checks (HTTP, gRPC, Envoy's RLS)
// that asked cost (micro-units) of one identity of p over d, in p's amount
// unit.
func DirectDemand(p *policy.Policy, cost int64, d time.Duration) int64 {
	if d <= 0 || cost <= 0 {
		return 0
	}
	return p.Limits().RateAmount(int64(float64(cost) / d.Seconds()))
}

// ReportedCost is the cost (micro-units) count reported requests of p
// stand for, capped far above any real report: the edge's demand is the
// region's too, so the agent's lease meter counts it as it counts direct
// checks', and the region's share follows the edge.
func ReportedCost(p *policy.Policy, count uint64) int64 {
	return int64(min(float64(count)*float64(p.Cost)*float64(policy.Micro), 1e18))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
