// Package httplimit writes what an HTTP answer says of a rate limit
// decision, the same for every server that answers one (the agent's HTTP
// API and the client library's middleware): the RateLimit header fields in
// the IETF draft version a deployment chose, Retry-After, and the
// problem detail (RFC 9457) of a 429.
package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/quota-lease/quota-lease/httplimit/sfv"
)

// The RateLimit header fields of the HTTP API (docs/http.md), in the
// version of the IETF draft a deployment chose (the agent's
// --http-ratelimit-headers). Every version is written from the
// same numbers of a decided request, Fields, so two deployments never
// disagree on what a check left, only on how they say it:
//
//   - Draft06, draft-ietf-httpapi-ratelimit-headers-06 (22
//     December 2022): RateLimit-Limit, RateLimit-Remaining,
//     RateLimit-Reset and RateLimit-Policy, plain integers;
//   - Draft11, draft-ietf-httpapi-ratelimit-headers-11 (23 May
//     2026): RateLimit-Policy and RateLimit, Lists of Structured Field
//     Items (RFC 9651), one per policy, each a String naming the policy
//     with its numbers as parameters;
//   - None: no RateLimit field.
//
// Retry-After is not one of them: a 429 carries it whichever is chosen.

// The versions of the RateLimit header fields the HTTP API can send.
const (
	Draft06 = "draft-06"
	Draft11 = "draft-11"
	None    = "none"
)

// Fields is what the RateLimit fields report of one decided request,
// in the whole units and seconds the drafts use.
type Fields struct {
	// Policy names the decision's policy.
	Policy string
	// Limit is how many units per window the region enforces (its share,
	// for a global policy), rounded down; Window is the policy's period in
	// seconds, rounded up (the drafts have no sub-second precision).
	Limit, Window int64
	// Remaining is the whole units left, rounded down, never negative;
	// Reset the seconds until the quota is whole again (the bucket full,
	// the window empty), rounded up.
	Remaining, Reset int64
	// RetryAfter is a refused request's Retry-After in seconds; 0 for an
	// admitted one.
	RetryAfter int64
	// Partition is the request's partition key (the agent sends the
	// SHA-256 of its identity); nil for a policy that counts every request
	// as one, or a server that does not know the identity.
	Partition []byte
}

// ValidVersion says whether v names a version Write knows.
func ValidVersion(v string) error {
	switch v {
	case Draft06, Draft11, None:
		return nil
	}
	return fmt.Errorf("ratelimit headers %q: use %s, %s or %s", v, Draft06, Draft11, None)
}

// Write sets the RateLimit fields of version (Draft06, Draft11 or None)
// for fs, one entry per policy that decided the request, in order. Draft06
// has room for one policy: the first.
func Write(h http.Header, version string, fs ...Fields) {
	if len(fs) == 0 {
		return
	}
	switch version {
	case Draft06:
		writeDraft06(h, fs[0])
	case Draft11:
		writeDraft11(h, fs)
	}
}

// writeDraft06 sets draft-06's fields (sections 3.1 to 3.3 and 5) for f:
// RateLimit-Limit and RateLimit-Remaining in units, RateLimit-Reset in
// seconds, RateLimit-Policy as "<limit>;w=<window>". Canonical keys are
// assigned directly (Header.Set would canonicalize and allocate on every
// answer), their values in one array.
func writeDraft06(h http.Header, f Fields) {
	v := make([]string, 4)
	v[0], v[1], v[2] = strconv.FormatInt(f.Limit, 10), strconv.FormatInt(f.Remaining, 10), strconv.FormatInt(f.Reset, 10)
	v[3] = v[0] + ";w=" + strconv.FormatInt(f.Window, 10)
	h["Ratelimit-Limit"] = v[0:1:1]
	h["Ratelimit-Remaining"] = v[1:2:2]
	h["Ratelimit-Reset"] = v[2:3:3]
	h["Ratelimit-Policy"] = v[3:4:4]
}

// writeDraft11 sets draft-11's RateLimit-Policy (section 3) and RateLimit
// (section 4) fields, one List member per entry of fs, in order. A value
// with no serialization (none reaches here: policy names are
// [a-z0-9._-]) leaves both fields out rather than send a malformed one,
// which a client must ignore anyway (section 7).
func writeDraft11(h http.Header, fs []Fields) {
	buf := bufs.Get().(*[]byte)
	defer bufs.Put(buf)
	w := sfWriter{b: (*buf)[:0]}
	for i, f := range fs {
		w.member(i, f.Policy)
		w.integer("q", f.Limit)
		w.integer("w", f.Window)
		w.bytes("pk", f.Partition)
	}
	quota := string(w.b)
	w.b = w.b[:0]
	for i, f := range fs {
		w.member(i, f.Policy)
		w.integer("r", f.Remaining)
		w.integer("t", f.EffectiveWindow())
		w.bytes("pk", f.Partition)
	}
	*buf = w.b[:0]
	if w.err != nil {
		return
	}
	v := []string{quota, string(w.b)}
	h["Ratelimit-Policy"], h["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// EffectiveWindow is draft-11's t (section 4.1.2): seconds within which
// the client can use no more than the remaining quota. For an admitted
// check, until the quota is whole again: exact for a fixed window, an
// upper bound for the algorithms that give quota back gradually. For a
// refused one, its Retry-After, which must not name a time before the end
// of the effective window (section 6): the same request fits then.
func (f Fields) EffectiveWindow() int64 {
	if f.RetryAfter > 0 {
		return f.RetryAfter
	}
	return f.Reset
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

// bufs holds the buffers fields are written in.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}
