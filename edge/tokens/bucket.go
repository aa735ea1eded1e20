package tokens

import (
	"math"
	"time"
)

// Bucket is a token-bucket assignment as Envoy enforces it: MaxTokens,
// refilled continuously by TokensPerFill every FillInterval (whole seconds:
// Envoy truncates the interval to seconds and divides by zero below one).
// A zero MaxTokens is no bucket: the instance is assigned DENY_ALL.
type Bucket struct {
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
}

// Deny reports whether b admits nothing (DENY_ALL).
func (b Bucket) Deny() bool { return b.MaxTokens == 0 }

// Rate is b's refill in requests per second.
func (b Bucket) Rate() float64 {
	if b.Deny() || b.FillInterval < time.Second {
		return 0
	}
	return float64(b.TokensPerFill) / math.Trunc(b.FillInterval.Seconds())
}

// WorstCase is the most an Envoy instance admits under b in any window of
// length w when b may start full at most once every `every`: one full
// bucket already there, one more per start inside the window, and the
// refill.
func (b Bucket) WorstCase(w, every time.Duration) float64 {
	if b.Deny() {
		return 0
	}
	starts := 1.0
	if every > 0 {
		starts += math.Floor(float64(w) / float64(every))
	}
	return starts*float64(b.MaxTokens) + b.Rate()*w.Seconds()
}

// Assignment tuning.
const (
	// DefaultBurstFraction (δ) is the part of an instance's refill given up
	// to pay for buckets that start full: the bucket holds δ of what its
	// share refills over the harmonic mean of the share's period and the
	// change interval, and refills what is left.
	DefaultBurstFraction = 0.2
	// fillPrecision: the fill interval is lengthened (up to maxFill) until
	// a fill holds this many tokens, so rounding tokens down loses at most
	// 1% of the rate.
	fillPrecision = 100
	maxFill       = 60 * time.Second
)

// Assign returns the token bucket for an instance whose share has shape s,
// whose bucket may start full at most once every `every` (the least time
// between changes of its assignment), giving up delta of the refill. prev
// is the bucket the instance holds now (zero if none): Envoy keeps a
// bucket whose max_tokens, tokens_per_fill and fill_interval nanoseconds
// are unchanged, even if its fill_interval seconds changed, so Assign never
// changes the interval alone.
//
// Its worst case (WorstCase(w, every)) is within s.Reference(w) for every
// w. With m = MaxTokens and f its refill per second:
//   - burst shares: m ≤ Burst and f ≤ Rate − m/every give
//     m(1 + w/every) + f·w ≤ m + Rate·w ≤ Burst + Rate·w;
//   - a sliding log (no burst): f ≤ Rate − m/every − m/Period gives, at
//     the end of every period k ≥ 1, m + k(m·P/every + f·P − Rate·P) ≤ 0
//     beyond k periods' worth, and within the first period at most
//     max(m, Rate·P) with m ≤ Rate·P.
//
// A share too small for one token under those rules is DENY_ALL.
func Assign(s Shape, every time.Duration, delta float64, prev Bucket) Bucket {
	if !(s.Rate > 0) || !(s.Period > 0) || every <= 0 || math.IsInf(s.Rate, 0) {
		return Bucket{}
	}
	I := every.Seconds()
	h := s.Period * I / (s.Period + I)
	m := math.Floor(delta * s.Rate * h)
	m = max(1, min(m, math.MaxUint32))
	if !s.Log && m > s.Burst {
		if m = math.Floor(s.Burst); m < 1 {
			return Bucket{}
		}
	}
	f := s.Rate - m/I
	if s.Log {
		if m > s.Rate*s.Period {
			return Bucket{}
		}
		f -= m / s.Period
	}
	return bucketOf(m, f, prev)
}

// bucketOf is the token bucket of m tokens refilled f a second, its fill
// interval lengthened until a fill holds fillPrecision tokens; DENY_ALL
// when f leaves no token. Envoy keeps the bucket it holds when a new one
// has the same max_tokens, tokens_per_fill and fill_interval nanoseconds,
// even if its fill_interval seconds differ (sameConfig), and with it the
// old rate; so against every bucket of avoid that the instance may hold
// (the last one sent, the policy's fallback) a bucket never differs in its
// interval alone.
func bucketOf(m, f float64, avoid ...Bucket) Bucket {
	if !(f > 0) || m < 1 {
		return Bucket{}
	}
	secs := math.Min(maxFill.Seconds(), math.Max(1, math.Ceil(fillPrecision/f)))
	n := math.Min(math.Floor(f*secs), math.MaxUint32)
	if n < 1 {
		return Bucket{}
	}
	b := Bucket{
		MaxTokens:     uint32(min(m, math.MaxUint32)),
		TokensPerFill: uint32(n),
		FillInterval:  time.Duration(secs) * time.Second,
	}
	for changed := true; changed; {
		changed = false
		for _, a := range avoid {
			if b.MaxTokens == a.MaxTokens && b.TokensPerFill == a.TokensPerFill && b.FillInterval != a.FillInterval {
				// Envoy would keep a's rate; a token less per fill is a
				// different bucket, and slower.
				if b.TokensPerFill--; b.TokensPerFill == 0 {
					return Bucket{}
				}
				changed = true
			}
		}
	}
	return b
}

// Resize is Assign for Envoy instances that start a token bucket replacing
// an assigned one at the old one's fill ratio (edge.Config.KeepsFill; Envoy PR
// #37624). A change then adds tokens only as far as max_tokens grows, and
// only a start adds a full bucket: a bucket Envoy does not surely hold as
// an assignment (its first, one after DENY_ALL, one that may have expired
// into its fallback). So a bucket may hold the share's whole burst, and
// keep its size while the share changes.
//
// What makes it safe is a virtual token bucket of the share's burst and
// rate, which admits in any window exactly what the share does
// (Shape.Reference): while the tokens Envoy's bucket holds (T) never
// exceed the virtual bucket's (V), whatever Envoy admits the share
// admits. Both lose a token per request, V refills at the share's rate and
// T at a little less (the refill withholds w), so V − T never falls but
// when a start or growth adds tokens to T; slack is what the agent knows
// of V − T (edge.Slot keeps it: it grows by w a second while the instance may
// hold the bucket, up to Burst less its size, and by the rate once it
// holds none, up to Burst; a new slot starts with Burst, the virtual
// bucket full). A start of m tokens, or growth by m, is sent only while
// slack covers it, and uses it up; a shrink adds nothing (Envoy scales the
// tokens down).
//
// held is the bucket Envoy surely holds (zero for a start); avoid are the
// buckets it may hold (bucketOf). Resize returns the bucket, the slack
// left and the refill withheld a second, w = min(Burst/2, delta·Rate·over)
// /over: what rebuilds the slack while a bucket is held, so that within
// `over` that much of it is back (none while the bucket holds the whole
// burst: V − T can then be 0 with both full). A sliding log's shape (no
// burst) has no virtual bucket to check against; it gets Assign's bucket.
func Resize(
	s Shape,
	held Bucket,
	slack float64,
	over time.Duration,
	delta float64,
	avoid ...Bucket,
) (b Bucket, left, withheld float64) {
	if !(s.Rate > 0) || !(s.Period > 0) || over <= 0 || math.IsInf(s.Rate, 0) || s.Log || s.Burst < 1 {
		return Bucket{}, min(slack, max(0, s.Burst)), 0 // the virtual bucket of a share too small for a token
	}
	c := min(math.Floor(s.Burst), math.MaxUint32)
	w := min(s.Burst/2, delta*s.Rate*over.Seconds()) / over.Seconds()
	slack = min(slack, s.Burst)
	var m, used float64
	if held.Deny() {
		m = min(c, math.Floor(slack)) // a start: a full bucket
		used = m
	} else {
		m = min(float64(held.MaxTokens), c)
		slack = min(slack, s.Burst-m) // a smaller share's virtual bucket holds less
		used = min(c-m, math.Floor(slack))
		m += used
	}
	b = bucketOf(m, s.Rate-w, append(avoid, held)...)
	if b.Deny() {
		return Bucket{}, slack, 0
	}
	return b, slack - used, w
}
