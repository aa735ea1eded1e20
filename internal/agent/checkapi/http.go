package checkapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
)

// The HTTP contract (docs/http.md): POST /v1/check decides one check; a
// rejection is 429 with application/problem+json (RFC 9457), Retry-After
// in whole seconds rounded up, Cache-Control: no-store, and the remaining
// quota in the RateLimit fields of the draft version the deployment chose
// (package httplimit; draft-ietf-httpapi-ratelimit-headers-06 by default).
// The body names the policy and never an internal key.

// MaxCheckBody bounds a check request body.
const MaxCheckBody = 64 << 10

// Problem types.
const (
	ProblemInvalidRequest = "urn:quota-lease:problem:invalid-request"
	ProblemUnavailable    = "urn:quota-lease:problem:unavailable"
)

// Handler returns the agent's HTTP API: /v1/check, /metrics, /healthz
// (the process is alive) and /readyz (it can admit traffic).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/check", s.serveCheck)
	mux.Handle("/metrics", s.c.Metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := s.c.Ready(); !ok {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

func writeProblem(w http.ResponseWriter, p problem) {
	writeJSON(w, p.Status, problemContentType, func(b []byte) []byte { return appendProblem(b, p) })
}

// writeJSON answers with status and the JSON fill appends, in a pooled
// buffer, so an answer allocates nothing of its own.
func writeJSON(w http.ResponseWriter, status int, contentType []string, fill func([]byte) []byte) {
	h := w.Header()
	h["Content-Type"] = contentType
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	buf := bufs.Get().(*[]byte)
	*buf = fill((*buf)[:0])
	w.Write(*buf)
	bufs.Put(buf)
}

func badRequest(w http.ResponseWriter, status int, detail string) {
	writeProblem(w, problem{Type: ProblemInvalidRequest, Title: http.StatusText(status), Status: status, Detail: detail})
}

func (s *Server) serveCheck(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		badRequest(w, http.StatusMethodNotAllowed, "use POST with a JSON body")
		return
	}
	buf := bufs.Get().(*[]byte)
	defer bufs.Put(buf)
	body, err := readBody(r.Body, (*buf)[:0], MaxCheckBody)
	*buf = body[:0]
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			// The rest of the body is not read: the connection cannot be reused.
			w.Header()["Connection"] = closeConnection
			badRequest(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", MaxCheckBody))
			return
		}
		badRequest(w, http.StatusBadRequest, "could not read the body")
		return
	}
	var in checkBody
	if err := decodeCheckBody(body, &in); err != nil {
		badRequest(w, http.StatusBadRequest,
			"the body must be JSON: {\"policy\": ..., \"attributes\": {...}, \"cost\": 1}: "+err.Error())
		return
	}
	o, err := s.c.Checker.Check(r.Context(), admission.Request{
		Policy:         in.Policy,
		Attributes:     in.Attributes,
		Cost:           in.Cost,
		Check:          in.Check,
		IdempotencyKey: in.IdempotencyKey,
		Reserve:        in.Reserve,
		Settle:         in.Settle,
	})
	if err != nil && !admission.IsInputError(err) { // nothing decided it: not the caller's fault
		writeProblem(w, problem{
			Type:   ProblemUnavailable,
			Title:  http.StatusText(http.StatusServiceUnavailable),
			Status: http.StatusServiceUnavailable,
			Detail: err.Error(),
		})
		return
	}
	if err != nil {
		badRequest(w, http.StatusBadRequest, err.Error())
		return
	}
	h := w.Header()
	s.writeLimitFields(h, o, in.Attributes)
	if !o.Allowed {
		h["Retry-After"] = httplimit.RetryAfter(o.RetryAfterMs)
		writeJSON(w, http.StatusTooManyRequests, problemContentType, func(b []byte) []byte {
			return httplimit.AppendRateLimited(b, o.Policy.Name, o.RetryAfterMs)
		})
		return
	}
	writeJSON(w, http.StatusOK, jsonContentType, func(b []byte) []byte {
		return appendAnswer(b, checkAnswer{
			Allowed:     true,
			Policy:      o.Policy.Name,
			Remaining:   o.RemainingUnits(),
			Limit:       enforcedLimit(o),
			ResetMs:     o.ResetAfterMs,
			Mode:        string(o.Mode),
			Replayed:    o.Replayed,
			Shadow:      o.Shadow,
			Reservation: o.Reservation,
		})
	})
}

// Header values shared by every answer (net/http only reads them).
var (
	jsonContentType    = []string{"application/json"}
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
	closeConnection    = []string{"close"}
)

// bufs holds the buffers request bodies are read into and answers are
// written from.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// errBodyTooLarge: a body over the limit readBody was given.
var errBodyTooLarge = errors.New("body too large")

// readBody appends r's content to b, up to max bytes; more is
// errBodyTooLarge.
func readBody(r io.Reader, b []byte, max int) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):min(cap(b), max+1)])
		b = b[:len(b)+n]
		if len(b) > max {
			return b, errBodyTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
