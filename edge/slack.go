package edge

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// This file sizes a slot's token bucket for Envoy instances that keep a
// replaced bucket's fill (Tuning.KeepsFill, tokens.Resize): the slack, what the
// agent knows of the room a virtual bucket of the share leaves over
// Envoy's, kept up to date as time passes and spent by starts and growth.

// refill brings the slot's slack up to now.
func (s *Slot) refill(now time.Time) {
	if s.slackAt.IsZero() {
		s.slack, s.slackAt = math.Inf(1), now // a new slot: Resize caps it at the burst
		return
	}
	if t := earlier(now, s.mayHold).Sub(s.slackAt); t > 0 {
		s.slack = max(s.slack, min(s.slack+s.withheld*t.Seconds(), s.burst-float64(s.Bucket.MaxTokens)))
	}
	if t := now.Sub(later(s.slackAt, s.mayHold)); t > 0 {
		s.slack = max(s.slack, min(s.slack+s.rate*t.Seconds(), s.burst))
	}
	s.slackAt = now
}

// resize gives the slot its bucket for share of p at now (tokens.Assign, or
// tokens.Resize when Envoy keeps a replaced bucket's fill).
func (s *Slot) resize(now time.Time, p *policy.Policy, share int64, cfg Config) {
	sh := tokens.ShapeOf(p, share)
	if !cfg.KeepsFill || sh.Log {
		s.Bucket = tokens.Assign(sh, cfg.ChangeEvery, cfg.BurstFraction, s.Bucket)
		return
	}
	b, slack, w := s.sized(now, p, sh, cfg)
	s.size(sh, b, slack, w)
}

// sized is Resize's answer for a share of shape sh of p at now: the bucket
// the slot holds counts as held only if surely still held when the change
// reaches it, margin after now.
func (s *Slot) sized(now time.Time, p *policy.Policy, sh tokens.Shape, cfg Config) (tokens.Bucket, float64, float64) {
	s.refill(now)
	held := s.Bucket
	if !s.surelyHeld(now, cfg.Margin) {
		held = tokens.Bucket{}
	}
	return tokens.Resize(sh, held, s.slack, cfg.RepayOver, cfg.BurstFraction, s.Bucket, fallback(p))
}

// surelyHeld reports whether the instance surely still holds the slot's
// token bucket when a message sent at now reaches it, margin later.
func (s *Slot) surelyHeld(now time.Time, margin time.Duration) bool {
	return !s.Bucket.Deny() && now.Add(margin).Before(s.heldUntil)
}

// size takes Resize's answer for a share of shape sh: the slack grows at
// the new bucket's withheld refill (none under DENY_ALL, which refills
// nothing) and toward the new share's virtual bucket.
func (s *Slot) size(sh tokens.Shape, b tokens.Bucket, slack, withheld float64) {
	s.Bucket, s.slack, s.withheld = b, slack, withheld
	s.rate, s.burst = sh.Rate, sh.Burst
}

// grow gives the slot, refreshing an assignment of share of p, a larger
// bucket when its slack now covers one (tokens.Resize), and reports whether it
// did: a bucket sized while its slack was short, or while its share was
// smaller, grows once it may, and DENY_ALL sent for want of slack starts a
// bucket once there is. A token bucket grows only while surely held (or
// growing would be a start).
func (s *Slot) grow(now time.Time, p *policy.Policy, share int64, cfg Config) bool {
	if !s.Bucket.Deny() && !s.surelyHeld(now, cfg.Margin) {
		return false
	}
	sh := tokens.ShapeOf(p, share)
	b, slack, w := s.sized(now, p, sh, cfg)
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
func fallback(p *policy.Policy) tokens.Bucket {
	if p.Edge == nil || p.Edge.Expired.Rule != policy.EdgeTokenBucket {
		return tokens.Bucket{}
	}
	x := p.Edge.Expired
	return tokens.Bucket{MaxTokens: x.MaxTokens, TokensPerFill: x.TokensPerSecond, FillInterval: time.Second}
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
