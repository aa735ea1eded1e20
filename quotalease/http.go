package quotalease

import (
	"fmt"
	"net/http"
	"time"

	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/policy"
)

// HTTPOptions configure Client.Middleware.
type HTTPOptions struct {
	// Bucket is the bucket a request counts against, as the agent's
	// policies match it (for example {"policy": "api-per-tenant", "tenant":
	// r.Header.Get("X-Tenant")}); nil lets the request through undecided.
	Bucket func(*http.Request) map[string]string
	// Cost is the units a request costs (1 when nil).
	Cost func(*http.Request) uint64
	// Policy names the limit in a 429's body and the draft-11 fields;
	// empty takes the bucket's "policy" attribute, or "quota" when that is
	// not a policy name.
	Policy string
	// RateLimitHeaders is the version of the RateLimit header fields sent,
	// as the agent's --http-ratelimit-headers chooses them: "draft-06"
	// (the default), "draft-11" or "none".
	RateLimitHeaders string
}

// Middleware decides every request in-process before next sees it and
// answers a refused one as the agent's HTTP API answers a refused check:
// 429 with an application/problem+json body naming the policy,
// Retry-After in whole seconds, Cache-Control: no-store, and the RateLimit
// fields of the chosen version, which admitted requests carry too while
// their bucket holds a token bucket. The numbers are the client's bucket's
// (its part of the region's share); draft-11's fields carry no partition
// key, the client not knowing which of the bucket's entries are the
// policy's identity.
func (c *Client) Middleware(opts HTTPOptions) (func(http.Handler) http.Handler, error) {
	if opts.Bucket == nil {
		return nil, fmt.Errorf("quotalease: middleware: Bucket is nil: say which bucket a request counts against")
	}
	if opts.RateLimitHeaders == "" {
		opts.RateLimitHeaders = httplimit.Draft06
	}
	if err := httplimit.ValidVersion(opts.RateLimitHeaders); err != nil {
		return nil, fmt.Errorf("quotalease: middleware: %w", err)
	}
	if opts.Policy != "" && !policy.ValidName(opts.Policy) {
		return nil, fmt.Errorf("quotalease: middleware: policy %q is not a policy name "+
			"(1-63 characters of a-z, 0-9, '.', '_', '-')", opts.Policy)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			bucket := opts.Bucket(r)
			if bucket == nil {
				next.ServeHTTP(w, r)
				return
			}
			cost := uint64(1)
			if opts.Cost != nil {
				cost = opts.Cost(r)
			}
			d := c.AllowN(bucket, cost)
			name := nameOf(opts.Policy, bucket)
			h := w.Header()
			if opts.RateLimitHeaders != httplimit.None && d.Limit > 0 {
				httplimit.Write(h, opts.RateLimitHeaders, fieldsOf(name, d))
			}
			if d.Allowed {
				next.ServeHTTP(w, r)
				return
			}
			writeRefusal(w, name, d.RetryAfter)
		})
	}, nil
}

// writeRefusal writes the 429 of a request policy refused.
func writeRefusal(w http.ResponseWriter, policy string, retry time.Duration) {
	ms := retryMillis(retry)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h["Retry-After"] = httplimit.RetryAfter(ms)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(httplimit.AppendRateLimited(nil, policy, ms))
}

// fieldsOf is what the RateLimit fields say of d.
func fieldsOf(policy string, d Decision) httplimit.Fields {
	f := httplimit.Fields{
		Policy:    policy,
		Limit:     int64(d.Limit),
		Window:    httplimit.SecondsUp(d.Window.Milliseconds()),
		Remaining: int64(d.Remaining),
		Reset:     httplimit.SecondsUp(d.Reset.Milliseconds()),
	}
	if !d.Allowed {
		f.RetryAfter = httplimit.RetryAfterSecs(retryMillis(d.RetryAfter))
	}
	return f
}

// nameOf is the policy name answers give: set, else the bucket's policy
// attribute when it is a policy name, else "quota".
func nameOf(set string, bucket map[string]string) string {
	if set != "" {
		return set
	}
	if p := bucket["policy"]; policy.ValidName(p) {
		return p
	}
	return "quota"
}

// retryMillis is d in whole milliseconds, rounded up, at least 1.
func retryMillis(d time.Duration) int64 {
	return max(1, (d + time.Millisecond - 1).Milliseconds())
}
