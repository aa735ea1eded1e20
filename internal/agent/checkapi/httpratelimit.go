package checkapi

import (
	"crypto/sha256"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/sfv"
	"github.com/quota-lease/quota-lease/policy"
)

// The RateLimit header fields of the HTTP API (docs/http.md), in the
// version of the IETF draft a deployment chose (Answers.HTTPRateLimitHeaders,
// the agent's --http-ratelimit-headers). Every version is written from the
// same numbers of a decided check, limitFields, so two deployments never
// disagree on what a check left, only on how they say it:
//
//   - RateLimitDraft06, draft-ietf-httpapi-ratelimit-headers-06 (22
//     December 2022): RateLimit-Limit, RateLimit-Remaining,
//     RateLimit-Reset and RateLimit-Policy, plain integers;
//   - RateLimitDraft11, draft-ietf-httpapi-ratelimit-headers-11 (23 May
//     2026): RateLimit-Policy and RateLimit, Lists of Structured Field
//     Items (RFC 9651), one per policy, each a String naming the policy
//     with its numbers as parameters;
//   - RateLimitNone: no RateLimit field.
//
// Retry-After is not one of them: a 429 carries it whichever is chosen.

// The versions of the RateLimit header fields the HTTP API can send.
const (
	RateLimitDraft06 = "draft-06"
	RateLimitDraft11 = "draft-11"
	RateLimitNone    = "none"
)

// limitFields is what the RateLimit fields report of one decided check,
// in the whole units and seconds the drafts use.
type limitFields struct {
	// policy names the check's policy.
	policy string
	// limit is how many units per window the region enforces (its share,
	// for a global policy), rounded down; window is the policy's period in
	// seconds, rounded up (the drafts have no sub-second precision).
	limit, window int64
	// remaining is the whole units left, rounded down, never negative;
	// reset the seconds until the quota is whole again (the bucket full,
	// the window empty), rounded up.
	remaining, reset int64
	// retryAfter is a refused check's Retry-After in seconds; 0 for an
	// admitted one.
	retryAfter int64
	// partition is the check's partition key (partitionKey); nil for a
	// policy that counts every request as one.
	partition []byte
}

// limitFieldsOf is what the RateLimit fields report of o.
func limitFieldsOf(o admission.Outcome) limitFields {
	f := limitFields{
		policy:    o.Policy.Name,
		limit:     int64(math.Floor(enforcedLimit(o))),
		window:    secondsUp(time.Duration(o.Policy.Period).Milliseconds()),
		remaining: max(0, o.RemainingUnits()),
		reset:     secondsUp(o.ResetAfterMs),
	}
	if !o.Allowed {
		f.retryAfter = retryAfterSecs(o.RetryAfterMs)
	}
	return f
}

// partitionKey is the partition key draft-11 sends for a check of p with
// attrs: the SHA-256 of its identity as policy.IdentityOf writes it (for
// example "tenant=acme"), so a client can compute the key of a request it
// is about to send, and no tenant name or address is sent back. nil for a
// policy without identity attributes, which counts every request as one.
func partitionKey(p *policy.Policy, attrs map[string]string) []byte {
	if len(p.Identity) == 0 {
		return nil
	}
	id, err := p.IdentityOf(attrs)
	if err != nil { // unreachable: the check was decided under this identity
		return nil
	}
	sum := sha256.Sum256([]byte(id))
	return sum[:]
}

// writeLimitFields sets the RateLimit fields of the version the agent was
// configured with, for the check of attrs decided as o.
func (s *Server) writeLimitFields(h http.Header, o admission.Outcome, attrs map[string]string) {
	switch s.c.Answers.HTTPRateLimitHeaders {
	case RateLimitDraft06:
		writeDraft06(h, limitFieldsOf(o))
	case RateLimitDraft11:
		f := limitFieldsOf(o)
		f.partition = partitionKey(o.Policy, attrs)
		writeDraft11(h, []limitFields{f})
	}
}

// writeDraft06 sets draft-06's fields (sections 3.1 to 3.3 and 5) for f:
// RateLimit-Limit and RateLimit-Remaining in units, RateLimit-Reset in
// seconds, RateLimit-Policy as "<limit>;w=<window>". Canonical keys are
// assigned directly (Header.Set would canonicalize and allocate on every
// answer), their values in one array.
func writeDraft06(h http.Header, f limitFields) {
	v := make([]string, 4)
	v[0], v[1], v[2] = strconv.FormatInt(f.limit, 10), strconv.FormatInt(f.remaining, 10), strconv.FormatInt(f.reset, 10)
	v[3] = v[0] + ";w=" + strconv.FormatInt(f.window, 10)
	h["Ratelimit-Limit"], h["Ratelimit-Remaining"], h["Ratelimit-Reset"], h["Ratelimit-Policy"] = v[0:1:1], v[1:2:2], v[2:3:3], v[3:4:4]
}

// writeDraft11 sets draft-11's RateLimit-Policy (section 3) and RateLimit
// (section 4) fields, one List member per entry of fs, in order. A value
// with no serialization (none reaches here: policy names are
// [a-z0-9._-]) leaves both fields out rather than send a malformed one,
// which a client must ignore anyway (section 7).
func writeDraft11(h http.Header, fs []limitFields) {
	buf := bufs.Get().(*[]byte)
	defer bufs.Put(buf)
	w := sfWriter{b: (*buf)[:0]}
	for i, f := range fs {
		w.member(i, f.policy)
		w.integer("q", f.limit)
		w.integer("w", f.window)
		w.bytes("pk", f.partition)
	}
	quota := string(w.b)
	w.b = w.b[:0]
	for i, f := range fs {
		w.member(i, f.policy)
		w.integer("r", f.remaining)
		w.integer("t", f.effectiveWindow())
		w.bytes("pk", f.partition)
	}
	*buf = w.b[:0]
	if w.err != nil {
		return
	}
	v := []string{quota, string(w.b)}
	h["Ratelimit-Policy"], h["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// effectiveWindow is draft-11's t (section 4.1.2): seconds within which
// the client can use no more than the remaining quota. For an admitted
// check, until the quota is whole again: exact for a fixed window, an
// upper bound for the algorithms that give quota back gradually. For a
// refused one, its Retry-After, which must not name a time before the end
// of the effective window (section 6): the same request fits then.
func (f limitFields) effectiveWindow() int64 {
	if f.retryAfter > 0 {
		return f.retryAfter
	}
	return f.reset
}

// sfWriter appends the members of a Structured Field List, keeping the
// first error (sfv.ErrInvalid) and appending nothing after it.
type sfWriter struct {
	b   []byte
	err error
}

// member starts the i-th member, an Item whose value is the String s.
func (w *sfWriter) member(i int, s string) {
	if w.err != nil {
		return
	}
	if i > 0 {
		w.b = append(w.b, sfv.ListSeparator...)
	}
	w.b, w.err = sfv.AppendString(w.b, s)
}

// integer adds the parameter key with the Integer n.
func (w *sfWriter) integer(key string, n int64) {
	if w.err == nil {
		w.b, w.err = sfv.AppendParam(w.b, key)
	}
	if w.err == nil {
		w.b, w.err = sfv.AppendInteger(w.b, n)
	}
}

// bytes adds the parameter key with the Byte Sequence p, unless p is nil.
func (w *sfWriter) bytes(key string, p []byte) {
	if w.err == nil && p != nil {
		w.b, w.err = sfv.AppendParam(w.b, key)
	}
	if w.err == nil && p != nil {
		w.b = sfv.AppendByteSequence(w.b, p)
	}
}
