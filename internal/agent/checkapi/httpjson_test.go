package checkapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/httplimit"
)

// appendJSONString writes what encoding/json writes, for any string.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", `quote " and \ back`, "<script>&</script>", "\x00\x01\x1f\x7f", "tab\tnew\nline\r",
		"\u2028\u2029", "é ü 日本", "\xff\xfe bad utf-8 \xc3", "\b\f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json writes %s", s, got, want)
		}
	})
}

// encoded is v as json.Encoder writes it (with its newline).
func encoded(t *testing.T, v any) string {
	var b strings.Builder
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestAppendProblemAsEncodingJSON(t *testing.T) {
	for _, p := range []problem{
		{Type: ProblemInvalidRequest, Title: http.StatusText(400), Status: 400, Detail: `the body must be JSON: invalid character 'x' looking for "value"`},
		{Type: ProblemInvalidRequest, Title: "Request Entity Too Large", Status: 413},
		{Type: httplimit.ProblemRateLimited, Title: "Too Many Requests", Status: 429, Detail: "<&>", Policy: "api.v2", RetryAfterMs: 1500},
	} {
		if got, want := string(appendProblem(nil, p)), encoded(t, p); got != want {
			t.Errorf("appendProblem = %s, encoding/json writes %s", got, want)
		}
	}
	for _, ms := range []int64{1, 999, 1000, 1500, 59_998, 3_600_000} {
		want := encoded(t, problem{Type: httplimit.ProblemRateLimited, Title: "Too Many Requests", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("policy api-2.x admits no more now; retry after %gs", (time.Duration(ms) * time.Millisecond).Seconds()),
			Policy: "api-2.x", RetryAfterMs: ms})
		if got := string(httplimit.AppendRateLimited(nil, "api-2.x", ms)); got != want {
			t.Errorf("AppendRateLimited(%d) = %s, want %s", ms, got, want)
		}
	}
}

// readBody stops at the limit and says so.
func TestReadBody(t *testing.T) {
	for _, n := range []int{0, 1, 511, 512, 513, 4096} {
		in := strings.Repeat("x", n)
		got, err := readBody(strings.NewReader(in), nil, 4096)
		if err != nil || string(got) != in {
			t.Fatalf("%d bytes under a 4096 limit: %d bytes, %v", n, len(got), err)
		}
		if _, err := readBody(strings.NewReader(in+"y"), make([]byte, 0, 8), n); err != errBodyTooLarge {
			t.Fatalf("%d+1 bytes over a %d limit: %v", n, n, err)
		}
	}
}

// Whatever the body, decodeCheckBody decodes it as json.Unmarshal does:
// the plain form by itself, the rest through encoding/json; but a body
// encoding/json would decode inexactly (invalid UTF-8, a lone surrogate
// escape: both become U+FFFD) it refuses.
func FuzzDecodeCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"policy":"api","attributes":{"tenant":"t1"}}`,
		`{"policy":"api","attributes":{"tenant":"acme","route":"/v1/x"},"cost":3,"idempotency_key":"k-1"}`,
		` { "policy" : "api" , "attributes" : { } , "cost" : -0 } `, `{}`, `null`, `[]`, `"x"`, `{"policy":"api"} x`,
		`{"Policy":"api"}`, `{"policy":"a\"b"}`, `{"policy":null}`, `{"cost":1.0}`, `{"cost":1e2}`, `{"cost":012}`,
		`{"cost":9223372036854775807}`, `{"cost":99999999999999999999}`, `{"attributes":{"a":"1","a":"2"}}`,
		`{"policy":"x","policy":"y"}`, `{"other":[1,{"x":2}],"policy":"api"}`, "{\"policy\":\"\xff\"}", "{\"policy\":\"é\"}",
		"{\"policy\":\"a\tb\"}", `{"attributes":{"a":null}}`, `{"attributes":null}`, `{"cost":"1"}`, `{"policy":"api",}`,
		`{"attributes":{"t":"\ud800"}}`, `{"attributes":{"t":"\udc00x"}}`, `{"attributes":{"t":"\ud83d\ude00"}}`, `{"attributes":{"t":"\\ud800"}}`,
		"{\"attributes\":{\"t\":\"\xff\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got, plain checkBody
		errWant := json.Unmarshal(data, &want)
		errGot := decodeCheckBody(data, &got)
		if errWant == nil && exactText(data) != nil {
			if errGot == nil {
				t.Fatalf("%q: decoded inexactly as %+v, not refused", data, got)
			}
			return
		}
		if (errWant == nil) != (errGot == nil) {
			t.Fatalf("%q: encoding/json says %v, decodeCheckBody %v", data, errWant, errGot)
		}
		if errWant == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%q: encoding/json decodes %+v, decodeCheckBody %+v", data, want, got)
		}
		if decodePlain(data, &plain) && (errWant != nil || !reflect.DeepEqual(want, plain)) {
			t.Fatalf("%q: decodePlain took it as %+v; encoding/json: %+v, %v", data, plain, want, errWant)
		}
	})
}

// The plain bodies clients send take the fast path.
func TestPlainBodiesTakeTheFastPath(t *testing.T) {
	for _, s := range []string{
		`{"policy":"api","attributes":{"tenant":"t1"}}`,
		`{"policy": "api", "attributes": {"tenant": "acme", "route": "/v1/x"}, "cost": 3, "idempotency_key": "k-1"}`,
		"{\n  \"policy\": \"api\",\n  \"attributes\": {\"user\": \"zoë\"}\n}\n",
	} {
		var in checkBody
		if !decodePlain([]byte(s), &in) {
			t.Errorf("%s: not decoded by the fast path", s)
		}
	}
}

// The hand-written admitted answer is byte for byte what encoding/json
// writes for it.
func TestAppendAnswerMatchesEncodingJSON(t *testing.T) {
	for _, a := range []checkAnswer{
		{Allowed: true, Policy: "api", Remaining: 7, Limit: 33.333333333333336, ResetMs: 1500, Mode: "leased"},
		{Allowed: true, Policy: "a.b-c_1", Remaining: 0, Limit: 1e-7, ResetMs: 0, Mode: "local-fallback", Replayed: true, Shadow: true, RetryAfterMs: 12},
		{Allowed: false, Policy: "x", Remaining: -1, Limit: 2.5e21, Mode: "region"},
		{Allowed: true, Policy: "x", Limit: 0, Mode: "degraded"},
		{Allowed: true, Policy: "llm", Limit: 1000, Mode: "leased", Reservation: `600.k"<&>\\`},
	} {
		var want bytes.Buffer
		json.NewEncoder(&want).Encode(a)
		if got := appendAnswer(nil, a); string(got) != want.String() {
			t.Errorf("got  %s\nwant %s", got, want.String())
		}
	}
}
