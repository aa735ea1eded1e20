package checkapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"reflect"
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

// pkOf is the partition key of identity, base64 as a Byte Sequence shows it.
func pkOf(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// The exact text of every version's fields, for admitted and refused
// checks, several policies and partition keys.
func TestRateLimitFieldsText(t *testing.T) {
	acme := sha256.Sum256([]byte("tenant=acme"))
	admitted := limitFields{policy: "api-per-tenant", limit: 50, window: 1, remaining: 41, reset: 1, partition: acme[:]}
	refused := limitFields{policy: "search", limit: 2, window: 60, remaining: 0, reset: 37, retryAfter: 37}
	// Refused by a token bucket: the cost fits again long before the
	// bucket is full; t is the Retry-After (draft-11, section 6).
	bucket := limitFields{policy: "upload.v2", limit: 10, window: 60, remaining: 3, reset: 42, retryAfter: 12}
	for _, c := range []struct {
		name string
		fs   []limitFields
		want map[string]string // draft-11's fields
		w06  map[string]string // draft-06's, for the first entry
	}{
		{"admitted, with a partition key", []limitFields{admitted},
			map[string]string{
				"RateLimit-Policy": `"api-per-tenant";q=50;w=1;pk=:` + pkOf("tenant=acme") + `:`,
				"RateLimit":        `"api-per-tenant";r=41;t=1;pk=:` + pkOf("tenant=acme") + `:`,
			},
			map[string]string{"RateLimit-Limit": "50", "RateLimit-Remaining": "41", "RateLimit-Reset": "1", "RateLimit-Policy": "50;w=1"}},
		{"refused, a policy without identity", []limitFields{refused},
			map[string]string{"RateLimit-Policy": `"search";q=2;w=60`, "RateLimit": `"search";r=0;t=37`},
			map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "37", "RateLimit-Policy": "2;w=60"}},
		{"refused before the quota is whole again", []limitFields{bucket},
			map[string]string{"RateLimit-Policy": `"upload.v2";q=10;w=60`, "RateLimit": `"upload.v2";r=3;t=12`},
			map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "3", "RateLimit-Reset": "42", "RateLimit-Policy": "10;w=60"}},
		{"several policies, one member each, in order", []limitFields{admitted, refused, bucket},
			map[string]string{
				"RateLimit-Policy": `"api-per-tenant";q=50;w=1;pk=:` + pkOf("tenant=acme") + `:, "search";q=2;w=60, "upload.v2";q=10;w=60`,
				"RateLimit":        `"api-per-tenant";r=41;t=1;pk=:` + pkOf("tenant=acme") + `:, "search";r=0;t=37, "upload.v2";r=3;t=12`,
			}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			writeDraft11(h, c.fs)
			if got := flatten(h); !reflect.DeepEqual(got, c.want) {
				t.Errorf("draft-11: got %q\nwant %q", got, c.want)
			}
			if c.w06 == nil {
				return
			}
			h = http.Header{}
			writeDraft06(h, c.fs[0])
			if got := flatten(h); !reflect.DeepEqual(got, c.w06) {
				t.Errorf("draft-06: got %q, want %q", got, c.w06)
			}
		})
	}
}

// flatten is h with one value per field, under the names as the drafts
// spell them.
func flatten(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if len(v) != 1 {
			out[k] = "several values"
			continue
		}
		switch k {
		case "Ratelimit":
			k = "RateLimit"
		case "Ratelimit-Policy", "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset":
			k = "RateLimit" + k[len("Ratelimit"):]
		}
		out[k] = v[0]
	}
	return out
}

// draft11Member is one member of a draft-11 field as a client reads it.
type draft11Member struct {
	Policy string
	Params map[string]any
}

// parseDraft11 reads a draft-11 field with an independent RFC 9651 parser
// (github.com/dunglas/httpsfv), as a client would, and checks what the
// draft requires of it: a List of Items whose values are Strings, every
// parameter it defines of the type it defines (sections 3.1 and 4.1).
func parseDraft11(t *testing.T, field string, required string, values []string) []draft11Member {
	t.Helper()
	l, err := httpsfv.UnmarshalList(values)
	if err != nil || len(l) == 0 {
		t.Fatalf("%s %q: not a non-empty List: %v", field, values, err)
	}
	var out []draft11Member
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		name, isString := it.Value.(string)
		if !ok || !isString {
			t.Fatalf("%s %q: member %#v is not an Item with a String value", field, values, m)
		}
		p := map[string]any{}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			p[k] = v
			switch k {
			case "q", "w", "r", "t":
				if n, ok := v.(int64); !ok || n < 0 || (k == "w" && n == 0) {
					t.Fatalf("%s %q: %s=%#v is not a non-negative Integer (w: positive)", field, values, k, v)
				}
			case "pk":
				if _, ok := v.([]byte); !ok {
					t.Fatalf("%s %q: pk=%#v is not a Byte Sequence", field, values, v)
				}
			}
		}
		if _, ok := p[required]; !ok {
			t.Fatalf("%s %q: member %q lacks the required %s", field, values, name, required)
		}
		out = append(out, draft11Member{Policy: name, Params: p})
	}
	return out
}

// The draft-11 fields read back through an independent parser as the
// numbers they were written from, and the draft's own examples read the
// same way (so the parser agrees with the draft on what is well formed).
func TestDraft11ReadsBack(t *testing.T) {
	acme, globex := sha256.Sum256([]byte("tenant=acme")), sha256.Sum256([]byte("tenant=globex"))
	fs := []limitFields{
		{policy: "api-per-tenant", limit: 50, window: 1, remaining: 41, reset: 1, partition: acme[:]},
		{policy: "api-per-tenant", limit: 50, window: 1, remaining: 0, reset: 1, retryAfter: 1, partition: globex[:]},
		{policy: "daily", limit: 999_999_999_999_999, window: 86400, remaining: 0, reset: 86400},
	}
	h := http.Header{}
	writeDraft11(h, fs)
	pol := parseDraft11(t, "RateLimit-Policy", "q", h["Ratelimit-Policy"])
	lim := parseDraft11(t, "RateLimit", "r", h["Ratelimit"])
	if len(pol) != len(fs) || len(lim) != len(fs) {
		t.Fatalf("%d and %d members, want %d", len(pol), len(lim), len(fs))
	}
	for i, f := range fs {
		wantPol := map[string]any{"q": f.limit, "w": f.window}
		wantLim := map[string]any{"r": f.remaining, "t": f.effectiveWindow()}
		if f.partition != nil {
			wantPol["pk"], wantLim["pk"] = f.partition, f.partition
		}
		if pol[i].Policy != f.policy || !reflect.DeepEqual(pol[i].Params, wantPol) {
			t.Errorf("RateLimit-Policy member %d: %+v, want %q %v", i, pol[i], f.policy, wantPol)
		}
		if lim[i].Policy != f.policy || !reflect.DeepEqual(lim[i].Params, wantLim) {
			t.Errorf("RateLimit member %d: %+v, want %q %v", i, lim[i], f.policy, wantLim)
		}
	}
	// Examples of draft-ietf-httpapi-ratelimit-headers-11, sections 3.2 and 4.2.
	for _, ex := range []struct{ field, required, value string }{
		{"RateLimit-Policy", "q", `"burst";q=100;w=60,"daily";q=1000;w=86400`},
		{"RateLimit-Policy", "q", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`},
		{"RateLimit", "r", `"default";r=50;t=30`},
		{"RateLimit", "r", `"default";r=300000000;t=60;pk=:QXBwLTk5OQ==:`},
	} {
		parseDraft11(t, ex.field, ex.required, []string{ex.value})
	}
}

// A value a String cannot carry leaves both draft-11 fields out: never a
// malformed field.
func TestDraft11LeavesOutWhatItCannotWrite(t *testing.T) {
	for _, fs := range [][]limitFields{
		{{policy: "café", limit: 1, window: 1}},
		{{policy: "ok", limit: 1, window: 1}, {policy: "a\nb", limit: 1, window: 1}},
		{{policy: "huge", limit: 1e15, window: 1}},
	} {
		h := http.Header{}
		writeDraft11(h, fs)
		if len(h) != 0 {
			t.Errorf("%+v: wrote %q", fs, h)
		}
	}
}

// The numbers every version reports of an outcome: the enforced share
// rounded down, the window and reset rounded up, the remaining never
// negative, a Retry-After only when refused.
func TestLimitFieldsOf(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1500ms\n")
	full := p.Limits()
	half := full
	half.Rate = full.Rate * 3 / 4 // a share of 7.5 per period
	for _, c := range []struct {
		name string
		o    admission.Outcome
		want limitFields
	}{
		{"admitted", admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: 4*policy.Micro + 999_999, ResetAfterMs: 1001}, Policy: p, Limits: full},
			limitFields{policy: "api", limit: 10, window: 2, remaining: 4, reset: 2}},
		{"refused, a share", admission.Outcome{Decision: policy.Decision{Remaining: 0, RetryAfterMs: 1, ResetAfterMs: 1400}, Policy: p, Limits: half},
			limitFields{policy: "api", limit: 7, window: 2, remaining: 0, reset: 2, retryAfter: 1}},
		{"negative remaining", admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: -3 * policy.Micro}, Policy: p, Limits: full},
			limitFields{policy: "api", limit: 10, window: 2}},
	} {
		if got := limitFieldsOf(c.o); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	pk := partitionKey(p, map[string]string{"tenant": "acme corp"})
	if want := sha256.Sum256([]byte("tenant=acme%20corp")); !bytes.Equal(pk, want[:]) {
		t.Errorf("partition key %x, want SHA-256 of the escaped identity %x", pk, want)
	}
	if pk := partitionKey(&policy.Policy{Name: "all"}, map[string]string{"tenant": "acme"}); pk != nil {
		t.Errorf("a policy without identity attributes has partition key %x", pk)
	}
}

// BenchmarkLimitFields: what each version's fields cost an answer, on
// their own (no Redis), in one run for a ratio: draft-11 also computes the
// partition key (the identity again and its SHA-256).
func BenchmarkLimitFields(b *testing.B) {
	p := testenv.MustPolicy(b, "name: api-per-tenant\nidentity: [tenant]\nlimit: 50\nperiod: 1s\n")
	o := admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: 41 * policy.Micro, ResetAfterMs: 180}, Policy: p, Limits: p.Limits()}
	attrs := map[string]string{"tenant": "acme"}
	for _, mode := range []string{RateLimitDraft06, RateLimitDraft11} {
		b.Run(mode, func(b *testing.B) {
			a := New(Config{Answers: Answers{HTTPRateLimitHeaders: mode}})
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				clear(h)
				a.writeLimitFields(h, o, attrs)
			}
		})
	}
}
