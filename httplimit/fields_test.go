package httplimit

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"reflect"
	"testing"

	"github.com/dunglas/httpsfv"
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
	admitted := Fields{Policy: "api-per-tenant", Limit: 50, Window: 1, Remaining: 41, Reset: 1, Partition: acme[:]}
	refused := Fields{Policy: "search", Limit: 2, Window: 60, Remaining: 0, Reset: 37, RetryAfter: 37}
	// Refused by a token bucket: the cost fits again long before the
	// bucket is full; t is the Retry-After (draft-11, section 6).
	bucket := Fields{Policy: "upload.v2", Limit: 10, Window: 60, Remaining: 3, Reset: 42, RetryAfter: 12}
	for _, c := range []struct {
		name string
		fs   []Fields
		want map[string]string // draft-11's fields
		w06  map[string]string // draft-06's, for the first entry
	}{
		{"admitted, with a partition key", []Fields{admitted},
			map[string]string{
				"RateLimit-Policy": `"api-per-tenant";q=50;w=1;pk=:` + pkOf("tenant=acme") + `:`,
				"RateLimit":        `"api-per-tenant";r=41;t=1;pk=:` + pkOf("tenant=acme") + `:`,
			},
			map[string]string{"RateLimit-Limit": "50", "RateLimit-Remaining": "41", "RateLimit-Reset": "1", "RateLimit-Policy": "50;w=1"}},
		{"refused, a policy without identity", []Fields{refused},
			map[string]string{"RateLimit-Policy": `"search";q=2;w=60`, "RateLimit": `"search";r=0;t=37`},
			map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "37", "RateLimit-Policy": "2;w=60"}},
		{"refused before the quota is whole again", []Fields{bucket},
			map[string]string{"RateLimit-Policy": `"upload.v2";q=10;w=60`, "RateLimit": `"upload.v2";r=3;t=12`},
			map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "3", "RateLimit-Reset": "42", "RateLimit-Policy": "10;w=60"}},
		{"several policies, one member each, in order", []Fields{admitted, refused, bucket},
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
	fs := []Fields{
		{Policy: "api-per-tenant", Limit: 50, Window: 1, Remaining: 41, Reset: 1, Partition: acme[:]},
		{Policy: "api-per-tenant", Limit: 50, Window: 1, Remaining: 0, Reset: 1, RetryAfter: 1, Partition: globex[:]},
		{Policy: "daily", Limit: 999_999_999_999_999, Window: 86400, Remaining: 0, Reset: 86400},
	}
	h := http.Header{}
	writeDraft11(h, fs)
	pol := parseDraft11(t, "RateLimit-Policy", "q", h["Ratelimit-Policy"])
	lim := parseDraft11(t, "RateLimit", "r", h["Ratelimit"])
	if len(pol) != len(fs) || len(lim) != len(fs) {
		t.Fatalf("%d and %d members, want %d", len(pol), len(lim), len(fs))
	}
	for i, f := range fs {
		wantPol := map[string]any{"q": f.Limit, "w": f.Window}
		wantLim := map[string]any{"r": f.Remaining, "t": f.EffectiveWindow()}
		if f.Partition != nil {
			wantPol["pk"], wantLim["pk"] = f.Partition, f.Partition
		}
		if pol[i].Policy != f.Policy || !reflect.DeepEqual(pol[i].Params, wantPol) {
			t.Errorf("RateLimit-Policy member %d: %+v, want %q %v", i, pol[i], f.Policy, wantPol)
		}
		if lim[i].Policy != f.Policy || !reflect.DeepEqual(lim[i].Params, wantLim) {
			t.Errorf("RateLimit member %d: %+v, want %q %v", i, lim[i], f.Policy, wantLim)
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
	for _, fs := range [][]Fields{
		{{Policy: "café", Limit: 1, Window: 1}},
		{{Policy: "ok", Limit: 1, Window: 1}, {Policy: "a\nb", Limit: 1, Window: 1}},
		{{Policy: "huge", Limit: 1e15, Window: 1}},
	} {
		h := http.Header{}
		writeDraft11(h, fs)
		if len(h) != 0 {
			t.Errorf("%+v: wrote %q", fs, h)
		}
	}
}
