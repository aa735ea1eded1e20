package agent

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/policy"
)

// Attribute values that are not valid UTF-8, raw or as a lone surrogate
// escape, are refused with 400 instead of being counted as U+FFFD, one
// identity for many byte strings; a surrogate pair is a character.
func TestHTTPRefusesInvalidUTF8(t *testing.T) {
	ra := regionAgent(t, apiPolicy+"scope: region\n", nil)
	for body, want := range map[string]int{
		"{\"policy\":\"api\",\"attributes\":{\"tenant\":\"a\xffb\"}}":  http.StatusBadRequest,
		`{"policy":"api","attributes":{"tenant":"a\ud800b"}}`:          http.StatusBadRequest,
		`{"policy":"api","attributes":{"tenant":"\udc00"}, "cost": 1}`: http.StatusBadRequest,
		`{"policy":"api","attributes":{"tenant":"\ud83d\ude00"}}`:      http.StatusOK,
	} {
		resp, err := http.Post(ra.httpURL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == http.StatusBadRequest && !strings.Contains(string(msg), "UTF") {
			t.Errorf("%q: %d %s, want %d naming UTF-8", body, resp.StatusCode, msg, want)
		}
	}
	if _, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: map[string]string{"tenant": "a\xffb"}}); !errors.Is(err, policy.ErrInvalidIdentity) {
		t.Fatalf("invalid UTF-8 through Agent.Check: %v, want ErrInvalidIdentity", err)
	}
}

// Through a running agent on a real Redis, each choice of
// Config.HTTPRateLimitHeaders (--http-ratelimit-headers): exactly its
// fields, with the numbers of the answer's own body, on admitted and
// refused checks of two identities; Retry-After on a 429 whichever; and
// none on a refused request.
func TestHTTPRateLimitHeaderChoice(t *testing.T) {
	const pol = "name: search\nidentity: [user]\nalgorithm: fixed_window\nlimit: 2\nperiod: 1m\nscope: region\n"
	for _, mode := range []string{httplimit.Draft06, httplimit.Draft11, httplimit.None} {
		t.Run(mode, func(t *testing.T) {
			ra := regionAgent(t, pol, func(c *Config) { c.HTTPRateLimitHeaders = mode })
			roomInWindow(t, time.Minute)
			for i, c := range []struct {
				user    string
				allowed bool
			}{{"u1", true}, {"u1", true}, {"u1", false}, {"u2", true}} {
				status, h, body := postCheck(t, ra.httpURL, `{"policy":"search","attributes":{"user":"`+c.user+`"}}`)
				if status != map[bool]int{true: http.StatusOK, false: http.StatusTooManyRequests}[c.allowed] {
					t.Fatalf("check %d: status %d, body %v", i, status, body)
				}
				// t, and draft-06's reset: the window's end for a fixed
				// window, which is also when a refused check fits again.
				var remaining, seconds int64
				if c.allowed {
					remaining, seconds = int64(body["remaining"].(float64)), (int64(body["reset_ms"].(float64))+999)/1000
				} else {
					seconds = (int64(body["retry_after_ms"].(float64)) + 999) / 1000
					if got := h.Get("Retry-After"); got != strconv.FormatInt(seconds, 10) {
						t.Errorf("check %d: Retry-After %q, want %d", i, got, seconds)
					}
				}
				if want := int64(1 - i%2); c.user == "u1" && c.allowed && remaining != want {
					t.Fatalf("check %d: remaining %d, want %d", i, remaining, want)
				}
				var want map[string]string
				r, s, pk := strconv.FormatInt(remaining, 10), strconv.FormatInt(seconds, 10), ";pk=:"+partitionKey("user="+c.user)+":"
				switch mode {
				case httplimit.Draft06:
					want = map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": r, "RateLimit-Reset": s, "RateLimit-Policy": "2;w=60"}
				case httplimit.Draft11:
					want = map[string]string{"RateLimit-Policy": `"search";q=2;w=60` + pk, "RateLimit": `"search";r=` + r + `;t=` + s + pk}
				case httplimit.None:
					want = map[string]string{}
				}
				if got := rateLimitFieldsIn(h); !reflect.DeepEqual(got, want) {
					t.Errorf("check %d (%s, allowed %v): RateLimit fields %q, want %q", i, c.user, c.allowed, got, want)
				}
			}
			// Bad input is answered without RateLimit fields and charges
			// nothing: u2 still has its second unit.
			if status, h, _ := postCheck(t, ra.httpURL, `{"policy":"search","attributes":{}}`); status != http.StatusBadRequest || len(rateLimitFieldsIn(h)) != 0 {
				t.Errorf("bad input: %d with %q", status, rateLimitFieldsIn(h))
			}
			if status, _, body := postCheck(t, ra.httpURL, `{"policy":"search","attributes":{"user":"u2"}}`); status != http.StatusOK || body["remaining"] != float64(0) {
				t.Errorf("u2's second check: %d %v", status, body)
			}
		})
	}
}

// postCheck posts body to the agent at url's /v1/check: the status, the
// headers and the JSON body.
func postCheck(t *testing.T, url, body string) (int, http.Header, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("body: %v", err)
	}
	return resp.StatusCode, resp.Header, out
}

// rateLimitFieldsIn is the RateLimit fields of h, of any draft, under
// the names as the drafts spell them.
func rateLimitFieldsIn(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		if rest, ok := strings.CutPrefix(k, "Ratelimit"); ok {
			out["RateLimit"+rest] = strings.Join(v, ", ")
		}
	}
	return out
}

// partitionKey is the partition key of identity, base64 as a Byte
// Sequence shows it.
func partitionKey(identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return base64.StdEncoding.EncodeToString(sum[:])
}

// The agent refuses a version it does not know, and the empty string: a
// zero is a value, never a request for the default.
func TestValidateConfigRateLimitHeaders(t *testing.T) {
	for _, v := range []string{"", "draft-12", "Draft-06"} {
		c := DefaultConfig()
		c.HTTPRateLimitHeaders = v
		if err := ValidateConfig(c); err == nil || !strings.Contains(err.Error(), "http ratelimit headers") {
			t.Errorf("%q: %v", v, err)
		}
	}
}
