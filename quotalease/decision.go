package quotalease

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge/envoy"
)

// Decision is a client's answer to one request, with what its bucket says
// of the quota left, for a caller that reports it (the middleware's
// RateLimit and Retry-After fields).
type Decision struct {
	Allowed bool
	// Limit is how many units the bucket's token bucket refills per
	// Window; both 0 when the bucket holds no token bucket (a blanket
	// rule, or no assignment yet).
	Limit  uint64
	Window time.Duration
	// Remaining is the whole units the token bucket holds after this
	// decision; Reset is how long until it is full again.
	Remaining uint64
	Reset     time.Duration
	// RetryAfter is, for a refused request, how long until the same
	// request could fit: until the token bucket holds its cost again, at
	// most until its assignment ends; for a denying rule, until it ends,
	// at most a report interval (a report may bring an assignment). 0
	// when allowed.
	RetryAfter time.Duration
}

// decisionOf is the Decision for a request of n units decided allowed or
// not, st being its bucket's state right after; retry bounds the wait of
// a denial whose end is unknown.
func decisionOf(allowed bool, n uint64, st envoy.State, now, retry time.Duration) Decision {
	d := Decision{Allowed: allowed}
	tb := st.Strategy.Bucket
	rate := tb.Rate()
	limited := st.HasLimiter && st.Strategy.Kind == envoy.TokenBucket && rate > 0 && !math.IsInf(rate, 1)
	if limited {
		d.Window = tb.FillInterval.Truncate(time.Second)
		d.Limit = uint64(tb.TokensPerFill)
		d.Remaining = uint64(st.Tokens)
		d.Reset = seconds((float64(tb.MaxTokens) - st.Tokens) / rate)
	}
	if allowed {
		return d
	}
	// The action ends at Until (and the next assignment may differ): no
	// wait is said to be longer than that, nor, for a rule whose end
	// nothing sets, than a report interval.
	end := retry
	if st.Phase != envoy.Default && st.Until > now {
		end = st.Until - now
	}
	switch {
	case limited && float64(n) <= float64(tb.MaxTokens):
		d.RetryAfter = min(seconds((float64(n)-st.Tokens)/rate), end)
	default:
		d.RetryAfter = min(end, retry)
	}
	return d
}

// seconds is s seconds as a Duration, never negative.
func seconds(s float64) time.Duration { return time.Duration(max(0, s) * float64(time.Second)) }
