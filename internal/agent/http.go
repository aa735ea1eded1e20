package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The HTTP contract (docs/http.md): POST /v1/check decides one check; a
// rejection is 429 with application/problem+json (RFC 9457), Retry-After
// in whole seconds rounded up, Cache-Control: no-store, and the remaining
// quota in the RateLimit-* fields of draft-ietf-httpapi-ratelimit-headers-06.
// The body names the policy and never an internal key.

// MaxCheckBody bounds a check request body.
const MaxCheckBody = 64 << 10

// Problem types.
const (
	ProblemRateLimited    = "urn:quota-lease:problem:rate-limited"
	ProblemInvalidRequest = "urn:quota-lease:problem:invalid-request"
)

// checkBody is the JSON of POST /v1/check.
type checkBody struct {
	Policy         string            `json:"policy"`
	Attributes     map[string]string `json:"attributes"`
	Cost           int64             `json:"cost"`
	IdempotencyKey string            `json:"idempotency_key"`
}

// checkAnswer is the JSON answer of an admitted check.
type checkAnswer struct {
	Allowed      bool    `json:"allowed"`
	Policy       string  `json:"policy"`
	Remaining    int64   `json:"remaining"`
	Limit        float64 `json:"limit"`
	ResetMs      int64   `json:"reset_ms"`
	Mode         string  `json:"mode"`
	Replayed     bool    `json:"replayed,omitempty"`
	Shadow       bool    `json:"shadow,omitempty"`
	RetryAfterMs int64   `json:"retry_after_ms,omitempty"`
}

// problem is an RFC 9457 problem detail.
type problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail,omitempty"`
	Policy       string `json:"policy,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// HTTPHandler returns the agent's HTTP API: /v1/check, /metrics, /healthz
// (the process is alive) and /readyz (it can admit traffic).
func (a *Agent) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/check", a.serveCheck)
	mux.Handle("/metrics", promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := a.Readiness(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

func writeProblem(w http.ResponseWriter, p problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}

func badRequest(w http.ResponseWriter, status int, detail string) {
	writeProblem(w, problem{Type: ProblemInvalidRequest, Title: http.StatusText(status), Status: status, Detail: detail})
}

func (a *Agent) serveCheck(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		badRequest(w, http.StatusMethodNotAllowed, "use POST with a JSON body")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxCheckBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			badRequest(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxCheckBody))
			return
		}
		badRequest(w, http.StatusBadRequest, "could not read the body")
		return
	}
	var in checkBody
	if err := json.Unmarshal(body, &in); err != nil {
		badRequest(w, http.StatusBadRequest, "the body must be JSON: {\"policy\": ..., \"attributes\": {...}, \"cost\": 1}: "+err.Error())
		return
	}
	o, err := a.Check(r.Context(), Input{Policy: in.Policy, Attributes: in.Attributes, Cost: in.Cost, IdempotencyKey: in.IdempotencyKey})
	if err != nil {
		badRequest(w, http.StatusBadRequest, err.Error())
		return
	}
	// Canonical keys assigned directly: Header.Set would canonicalize (and
	// allocate) on every answer.
	h := w.Header()
	limit := enforcedLimit(o)
	whole := strconv.FormatInt(int64(math.Floor(limit)), 10)
	h["Ratelimit-Limit"] = []string{whole}
	h["Ratelimit-Remaining"] = []string{strconv.FormatInt(o.RemainingUnits(), 10)}
	h["Ratelimit-Reset"] = []string{ceilSeconds(o.ResetAfterMs)}
	h["Ratelimit-Policy"] = []string{whole + ";w=" + ceilSeconds(time.Duration(o.Policy.Period).Milliseconds())}
	if !o.Allowed {
		h.Set("Retry-After", retryAfterSeconds(o.RetryAfterMs))
		writeProblem(w, problem{Type: ProblemRateLimited, Title: "Too Many Requests", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("policy %s admits no more now; retry after %s", o.Policy.Name, time.Duration(o.RetryAfterMs)*time.Millisecond),
			Policy: o.Policy.Name, RetryAfterMs: o.RetryAfterMs})
		return
	}
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	w.Write(appendAnswer(make([]byte, 0, 160), checkAnswer{Allowed: true, Policy: o.Policy.Name, Remaining: o.RemainingUnits(), Limit: limit,
		ResetMs: o.ResetAfterMs, Mode: string(o.Mode), Replayed: o.Replayed, Shadow: o.Shadow}))
}

// Header values shared by every answer (net/http only reads them).
var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
)

// appendAnswer appends a's JSON, as encoding/json would write it, to b:
// the admitted answer without an encoder per check. Policy names and
// modes need no escaping (policy.Policy.Validate allows [a-z0-9._-]).
func appendAnswer(b []byte, a checkAnswer) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, a.Allowed)
	b = append(b, `,"policy":"`...)
	b = append(b, a.Policy...)
	b = append(b, `","remaining":`...)
	b = strconv.AppendInt(b, a.Remaining, 10)
	b = append(b, `,"limit":`...)
	if abs := math.Abs(a.Limit); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		j, _ := json.Marshal(a.Limit) // exponent form, as encoding/json writes it
		b = append(b, j...)
	} else {
		b = strconv.AppendFloat(b, a.Limit, 'f', -1, 64)
	}
	b = append(b, `,"reset_ms":`...)
	b = strconv.AppendInt(b, a.ResetMs, 10)
	b = append(b, `,"mode":"`...)
	b = append(b, a.Mode...)
	b = append(b, '"')
	if a.Replayed {
		b = append(b, `,"replayed":true`...)
	}
	if a.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	if a.RetryAfterMs != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, a.RetryAfterMs, 10)
	}
	return append(b, "}\n"...)
}

// ceilSeconds formats ms as whole seconds, rounded up.
func ceilSeconds(ms int64) string { return strconv.FormatInt((ms+999)/1000, 10) }

// retryAfterSeconds is Retry-After: whole seconds rounded up, at least 1
// (0 would invite an immediate retry that is bound to fail).
func retryAfterSeconds(ms int64) string { return strconv.FormatInt(max(1, (ms+999)/1000), 10) }
