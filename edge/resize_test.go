package edge_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/policy"
)

// An instance's buckets, sized as the agent sizes them for an Envoy that
// starts a replaced bucket at the old one's fill ratio, admit nothing the
// share's own token bucket would not (its burst and rate: what the share
// admits in any window, Shape.Reference), the share being the one last
// sized for. Against Envoy's own buckets (package envoy), emptied as fast
// as they fill or left to fill (up to a period) and then emptied: the
// share changes as often as every 100 ms, shrinks and grows again, and
// assignments are left to expire into a fallback (a token bucket that
// starts full, so the next assignment does too) and restart soon after.
func TestResizeWithinShare(t *testing.T) {
	cfg := edge.DefaultConfig()
	cfg.BurstFraction = 0.99 // the slack rebuilt at up to half the burst over RepayOver, for every period
	total := 0               // buckets grown on a refresh
	for seed := uint64(1); seed <= 100; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		limit := []float64{6, 20, 100, 1000}[r.IntN(4)]
		period := []time.Duration{time.Second, 10 * time.Second, time.Minute}[r.IntN(3)]
		p := &policy.Policy{Name: "p", Identity: []string{"tenant"}, Algorithm: policy.TokenBucket, Limit: limit, Burst: limit, Period: policy.Duration(period), Cost: 1}
		p.Normalize()
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		big := p.Limits().Amount()
		shares := []int64{big, big / 3, big / 10}
		ttl := []time.Duration{time.Second, 4 * time.Second}[r.IntN(2)]
		t.Run(fmt.Sprintf("seed%d/limit%v-per-%s/ttl%s", seed, limit, period, ttl), func(t *testing.T) {
			set := envoy.Settings{NoAssignment: envoy.Strategy{Kind: envoy.DenyAll},
				Fallback:    &envoy.Strategy{Kind: envoy.TokenBucket, Bucket: envoy.TokenBucketConfig{MaxTokens: 5, TokensPerFill: 1, FillInterval: time.Second}},
				FallbackFor: time.Second}
			b := envoy.New(&set, 0)
			var s edge.Slot
			var share edge.Shape // the share's token bucket: v tokens
			v := 0.0
			t0 := time.Unix(0, 0)
			next, toggle := time.Duration(0), time.Duration(0)
			starts, grown, on := 0, 0, true
			var cur int64               // the share last sized for
			var heldUntil time.Duration // when its bucket surely expires, unrefreshed
			for ms := 0; ms < 120_000; ms++ {
				now := time.Duration(ms) * time.Millisecond
				v = min(share.Burst, v+share.Rate/1000)
				if now >= next {
					if r.IntN(6) == 0 { // silence: the assignment expires
						next = now + ttl + time.Duration(r.IntN(3000))*time.Millisecond
					} else if now < heldUntil && r.IntN(3) == 0 { // a refresh of the share held (Ledger.Due), grown if it may
						if s.Grow(t0.Add(now), p, cur, cfg) {
							grown++
						}
						heldUntil = now + ttl
						b.Assign(envoy.Assignment(s.Bucket), ttl, now)
						s.Pushed(t0.Add(now+ttl), t0.Add(now+ttl))
						next = now + time.Duration(100+r.IntN(2900))*time.Millisecond
					} else {
						if b.State(now).Phase != envoy.Assigned {
							starts++
						}
						sh := shares[r.IntN(len(shares))]
						cur, heldUntil = sh, now+ttl
						s.Resize(t0.Add(now), p, sh, cfg)
						if share.Rate == 0 {
							v = edge.ShapeOf(p, sh).Burst // a new share: full
						}
						share = edge.ShapeOf(p, sh)
						v = min(v, share.Burst)
						b.Assign(envoy.Assignment(s.Bucket), ttl, now)
						s.Pushed(t0.Add(now+ttl), t0.Add(now+ttl))
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
							t.Fatalf("at %s Envoy admitted with %+v, which the share's bucket (%+v) could not: %.3f tokens", now, s.Bucket, share, v)
						}
					}
				}
			}
			if starts < 3 {
				t.Fatalf("only %d starts: the test exercises too little", starts)
			}
			total += grown
		})
	}
	if total < 20 {
		t.Fatalf("only %d buckets grew on a refresh: the test exercises too little", total)
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
