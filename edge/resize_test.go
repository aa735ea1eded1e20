package edge_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// An instance's buckets, sized as the agent sizes them for an Envoy that
// starts a replaced bucket at the old one's fill ratio, admit nothing the
// share's own token bucket would not (its burst and rate: what the share
// admits in any window, Shape.Reference), the share being the larger of
// the old and the new while a change is on its way (the ledger reserves
// both until then). Against Envoy's own buckets (package envoy), emptied
// as fast as they fill or left to fill (up to a period) and then emptied:
// messages take up to the agent's margin to arrive, in order; the share
// changes as often as every 100 ms, shrinks to nothing and grows again;
// assignments are refreshed late or left to expire, into a fallback (a
// token bucket that starts full, so the next assignment does too) or
// none.
func TestResizeWithinShare(t *testing.T) {
	cfg := edge.DefaultConfig()
	cfg.BurstFraction = 0.99 // the slack rebuilt at up to half the burst over RepayOver, for every period
	total := 0               // buckets changed on a refresh
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		limit := []float64{6, 20, 100, 1000}[r.IntN(4)]
		period := []time.Duration{time.Second, 10 * time.Second, time.Minute}[r.IntN(3)]
		p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: limit, Burst: limit, Period: policy.Duration(period), Cost: 1}
		p.Normalize()
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		big := p.Limits().Amount()
		shares := []int64{big, big / 3, big / 10, big / 200}
		ttl := []time.Duration{time.Second, 4 * time.Second}[r.IntN(2)]
		set := envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}}
		if r.IntN(2) == 0 {
			set.Fallback = &envoy.Strategy{Kind: envoy.TokenBucket, Bucket: envoy.TokenBucketConfig{MaxTokens: 5, TokensPerFill: 1, FillInterval: time.Second}}
			set.FallbackFor = time.Second
		}
		t.Run(fmt.Sprintf("seed%d/limit%v-per-%s/ttl%s", seed, limit, period, ttl), func(t *testing.T) {
			b := envoy.New(&set, 0)
			var s edge.Slot
			type message struct {
				at     time.Duration
				bucket tokens.Bucket
				share  tokens.Shape
			}
			var queue []message    // sent, not yet arrived
			var share tokens.Shape // the share's token bucket: v tokens
			var v float64
			var last time.Duration // the last arrival
			t0 := time.Unix(0, 0)
			var next, toggle, heldUntil time.Duration // heldUntil: the agent's "surely held" (Ledger.Current)
			var cur int64                             // the share last sized for
			starts, on, sized := 0, true, false
			send := func(now time.Duration, sh tokens.Shape) {
				at := max(last, now+time.Duration(r.Int64N(int64(cfg.Margin))))
				last = at
				queue = append(queue, message{at, s.Bucket, sh})
				share = tokens.Shape{Rate: max(share.Rate, sh.Rate), Burst: max(share.Burst, sh.Burst)} // in transit: the larger
				s.Pushed(t0.Add(now+ttl), t0.Add(now+ttl+cfg.Margin))
				heldUntil = now + ttl
			}
			for ms := 0; ms < 120_000; ms++ {
				now := time.Duration(ms) * time.Millisecond
				v = min(share.Burst, v+share.Rate/1000)
				for len(queue) > 0 && queue[0].at <= now {
					m := queue[0]
					queue = queue[1:]
					if b.State(now).Phase != envoy.Assigned {
						starts++
					}
					b.Assign(envoy.Assignment(m.bucket), ttl, now)
					if len(queue) == 0 {
						share = m.share
					}
					v = min(v, share.Burst)
				}
				if now >= next {
					switch {
					case r.IntN(6) == 0: // silence: the assignment expires
						next = now + ttl + time.Duration(r.IntN(3000))*time.Millisecond
					case now < heldUntil && r.IntN(3) == 0: // a refresh of the share held (Ledger.Due), maybe late
						if s.Refresh(t0.Add(now), p, cur, cfg) {
							total++
						}
						send(now, tokens.ShapeOf(p, cur))
						next = now + time.Duration(100+r.IntN(2900))*time.Millisecond
					default:
						cur = shares[r.IntN(len(shares))]
						s.Resize(t0.Add(now), p, cur, cfg)
						if !sized {
							sized, v = true, tokens.ShapeOf(p, cur).Burst // a new slot: its share's bucket full
						}
						send(now, tokens.ShapeOf(p, cur))
						next = now + time.Duration(100+r.IntN(2900))*time.Millisecond
					}
				}
				if now >= toggle { // the caller pauses, letting the bucket fill, and takes all of it
					on, toggle = !on, now+time.Duration(r.IntN(1500))*time.Millisecond
					if !on && r.IntN(2) == 0 {
						toggle = now + time.Duration(r.Int64N(int64(period)*6/5))
					}
				}
				for i := 0; on && i < 1_000_000; i++ {
					assigned := b.State(now).Phase == envoy.Assigned
					if !b.Allow(now) {
						break
					}
					if assigned {
						if v -= 1; v < -1e-6 {
							t.Fatalf("at %s Envoy admitted with %+v, which the share's bucket (%+v) could not: %.3f tokens", now, b.State(now), share, v)
						}
					}
				}
			}
			if starts < 3 {
				t.Fatalf("only %d starts: the test exercises too little", starts)
			}
		})
	}
	if total < 20 {
		t.Fatalf("only %d buckets changed on a refresh: the test exercises too little", total)
	}
}

// A bucket starts with the share's whole burst (its virtual bucket full);
// what a start or growth adds to Envoy's bucket uses the slack between
// the two, which the withheld refill rebuilds while the bucket is held and
// the share's whole rate once none is. A shrink adds nothing, so a bucket
// shrunk and grown again grows back only as the slack comes back.
func TestResizeSlack(t *testing.T) {
	cfg := edge.DefaultConfig()
	cfg.RepayOver = 30 * time.Second // half the burst, 50, rebuilt in 30 s: 5/3 a second
	p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: 100, Burst: 100, Period: policy.Duration(time.Second), Cost: 1}
	p.Normalize()
	full := p.Limits().Amount()
	var s edge.Slot
	now := time.Unix(0, 0)
	push := func(share int64) int {
		t.Helper()
		s.Resize(now, p, share, cfg)
		s.Pushed(now.Add(4*time.Second), now.Add(5*time.Second))
		return int(s.Bucket.MaxTokens)
	}
	if m := push(full); m != 100 {
		t.Fatalf("first bucket holds %d, want the burst, 100", m)
	}
	now = now.Add(time.Second)
	if m := push(full / 10); m != 10 {
		t.Fatalf("shrunk bucket holds %d, want 10", m)
	}
	last := push(full)
	if last != 10 {
		t.Fatalf("bucket grown back at once holds %d, want 10 (no slack)", last)
	}
	for i := 0; i < 10; i++ { // refreshed every 3 s: grows by what 3 s rebuilt
		now = now.Add(3 * time.Second)
		m := push(full)
		if m < last+4 || m > last+5 {
			t.Fatalf("after %d refreshes the bucket holds %d, was %d: want 4 or 5 more", i+1, m, last)
		}
		last = m
	}
	now = now.Add(10 * time.Second) // expired unrefreshed: the virtual bucket refilled meanwhile
	if m := push(full); m != 100 {
		t.Fatalf("bucket restarted 10 s after its last assignment holds %d, want 100", m)
	}
	now = now.Add(time.Second) // cut short at once (a fault): a full bucket left no slack
	s.Pushed(now, now)
	if m := push(full); m != 0 {
		t.Fatalf("bucket restarted 1 s after a full start holds %d, want DENY_ALL", m)
	}
	now = now.Add(500 * time.Millisecond) // DENY_ALL holds nothing: the whole rate rebuilds
	if m := push(full); m != 50 {
		t.Fatalf("bucket restarted 0.5 s after DENY_ALL holds %d, want 50", m)
	}
}

// A refresh that may reach the instance after its bucket expired (sent
// less than the margin before) starts the bucket anew, full, and is sized
// as a start: here no slack is left, so DENY_ALL, and Envoy admits no more
// by then than the share does.
func TestLateRefreshIsAStart(t *testing.T) {
	cfg := edge.DefaultConfig()
	p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: 100, Burst: 100, Period: policy.Duration(10 * time.Second), Cost: 1}
	p.Normalize()
	full := p.Limits().Amount()
	t0, ttl := time.Unix(0, 0), time.Second
	b := envoy.New(&envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll}}, 0)
	var s edge.Slot
	s.Resize(t0, p, full, cfg)
	b.Assign(envoy.Assignment(s.Bucket), ttl, 0)
	s.Pushed(t0.Add(ttl), t0.Add(ttl+cfg.Margin))
	n := 0
	for b.Allow(0) {
		n++
	}
	s.Refresh(t0.Add(600*time.Millisecond), p, full, cfg) // arrives at 1.05 s, after the bucket expired
	b.Assign(envoy.Assignment(s.Bucket), ttl, 1050*time.Millisecond)
	for b.Allow(1050 * time.Millisecond) {
		n++
	}
	if ref := tokens.ShapeOf(p, full).Reference(1050 * time.Millisecond); float64(n) > ref {
		t.Errorf("admitted %d by 1.05 s, the share admits %.1f", n, ref)
	}
}

// Under DENY_ALL nothing is withheld: the slack comes back only as the
// share's own bucket refills, not at the withheld rate of the bucket
// before it.
func TestSlackUnderDenyAll(t *testing.T) {
	cfg := edge.DefaultConfig()
	p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: 100, Burst: 100, Period: policy.Duration(10 * time.Second), Cost: 1}
	p.Normalize()
	full := p.Limits().Amount()
	t0 := time.Unix(0, 0)
	at := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	var s edge.Slot
	push := func(sec float64) { s.Pushed(at(sec+4), at(sec+4.5)) }
	s.Resize(at(0), p, full, cfg) // 100 tokens, withholding 2 a second
	push(0)
	s.Resize(at(2), p, full/200, cfg) // a burst of 0.5: DENY_ALL, the share's bucket holds at most 0.5
	push(2)
	s.Resize(at(4), p, full/10, cfg) // 1 a second, a burst of 10: still DENY_ALL
	push(4)
	s.Refresh(at(6), p, full/10, cfg) // the share's bucket holds at most 0.5 + 2 s x 1
	if s.Bucket.MaxTokens > 2 {
		t.Errorf("started %d tokens where the share's bucket holds at most 2.5", s.Bucket.MaxTokens)
	}
}
