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
	h := w.Header()
	limit := enforcedLimit(o)
	h.Set("RateLimit-Limit", strconv.FormatInt(int64(math.Floor(limit)), 10))
	h.Set("RateLimit-Remaining", strconv.FormatInt(o.RemainingUnits(), 10))
	h.Set("RateLimit-Reset", ceilSeconds(o.ResetAfterMs))
	h.Set("RateLimit-Policy", fmt.Sprintf("%d;w=%s", int64(math.Floor(limit)), ceilSeconds(time.Duration(o.Policy.Period).Milliseconds())))
	if !o.Allowed {
		h.Set("Retry-After", retryAfterSeconds(o.RetryAfterMs))
		writeProblem(w, problem{Type: ProblemRateLimited, Title: "Too Many Requests", Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("policy %s admits no more now; retry after %s", o.Policy.Name, time.Duration(o.RetryAfterMs)*time.Millisecond),
			Policy: o.Policy.Name, RetryAfterMs: o.RetryAfterMs})
		return
	}
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(checkAnswer{Allowed: true, Policy: o.Policy.Name, Remaining: o.RemainingUnits(), Limit: limit,
		ResetMs: o.ResetAfterMs, Mode: string(o.Mode), Replayed: o.Replayed, Shadow: o.Shadow})
}

// ceilSeconds formats ms as whole seconds, rounded up.
func ceilSeconds(ms int64) string { return strconv.FormatInt((ms+999)/1000, 10) }

// retryAfterSeconds is Retry-After: whole seconds rounded up, at least 1
// (0 would invite an immediate retry that is bound to fail).
func retryAfterSeconds(ms int64) string { return strconv.FormatInt(max(1, (ms+999)/1000), 10) }
