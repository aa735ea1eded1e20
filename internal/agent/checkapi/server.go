// Package checkapi is the regional agent's check APIs: HTTP POST
// /v1/check (docs/http.md), gRPC quotalease.v1.CheckService and Envoy's
// RateLimitService as envoyproxy/ratelimit answers it (docs/envoy.md). Each
// only translates: it decodes and bounds the wire request, hands the
// admission.Requests to the agent's admission pipeline (a Checker), and
// encodes the outcomes. It decides, validates and charges nothing itself.
package checkapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/internal/logs"
)

// Checker decides checks: the agent's admission pipeline.
type Checker interface {
	Check(ctx context.Context, r admission.Request) (admission.Outcome, error)
	CheckBatch(ctx context.Context, rs []admission.Request) []admission.Result
}

// Answers are what a deployment chooses its answers to carry beyond the
// decision.
type Answers struct {
	// EnvoyLimitHeaders adds RateLimit-Limit, -Remaining and -Reset to
	// Envoy answers, for the descriptor closest to its limit, like
	// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED.
	EnvoyLimitHeaders bool
	// EnvoyRetryAfter adds one retry-after header to an Envoy OVER_LIMIT
	// answer: the longest wait of its descriptors over their limit, whole
	// seconds rounded up. A quota-lease extra: envoyproxy/ratelimit adds
	// no such header, so it is off by default.
	EnvoyRetryAfter bool
	// EnvoyPolicyNames names every Envoy answer's current_limit after the
	// policy that decided it, also where the configuration names none
	// (generated names like edge.remote_address). Off, as in
	// envoyproxy/ratelimit, current_limit.name is the configured
	// rate_limit.name, or empty.
	EnvoyPolicyNames bool
	// EnvoyExactCounts reports, in Envoy answers, what is left of a limit
	// also when a descriptor is over it (envoyproxy/ratelimit reports 0,
	// shadow mode included), and duration_until_reset to the millisecond
	// (it reports whole seconds).
	EnvoyExactCounts bool
	// EnvoyQuotaMode puts every limit in quota mode in Envoy answers, as
	// envoyproxy/ratelimit's QUOTA_MODE does (per limit:
	// policy.EnvoyMatch.QuotaMode): a descriptor over its limit is decided
	// and counted as usual but answered OK, and never makes the call
	// OVER_LIMIT.
	EnvoyQuotaMode bool
	// EnvoyDynamicMetadata adds dynamic_metadata to Envoy answers (the
	// call's domain, descriptors, hits and quota-mode violations), as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	EnvoyDynamicMetadata bool
	// HTTPRateLimitHeaders is the version of the IETF RateLimit header
	// fields the HTTP API sends (package httplimit, docs/http.md):
	// httplimit.Draft06 by default, httplimit.Draft11 or httplimit.None.
	HTTPRateLimitHeaders string
}

// DefaultAnswers are envoyproxy/ratelimit's answers to Envoy, and the HTTP
// API's RateLimit fields of draft-06.
func DefaultAnswers() Answers { return Answers{HTTPRateLimitHeaders: httplimit.Draft06} }

// Validate reports a choice the check APIs cannot answer with.
func (a Answers) Validate() error {
	if err := httplimit.ValidVersion(a.HTTPRateLimitHeaders); err != nil {
		return fmt.Errorf("http %w", err)
	}
	return nil
}

// Config is what the check APIs are given.
type Config struct {
	Checker Checker
	Answers Answers
	// Envoy is the index of the Envoy domains of the policies in force
	// (nil before any).
	Envoy func() EnvoyIndex
	// Ready says whether the agent can admit traffic, and why not (/readyz).
	Ready func() (ok bool, why string)
	// Metrics serves /metrics.
	Metrics http.Handler
	// HandshakeFailures counts the HTTP connections closed before their
	// handshake completed, by reason; Log logs them and the HTTP server's
	// own lines, paced.
	HandshakeFailures *prometheus.CounterVec
	Log               *logs.Paced
}

// MaxBatch bounds a batch of checks, and the descriptors of one Envoy
// request.
const MaxBatch = 1000

// Server is the agent's check APIs: HTTP POST /v1/check, gRPC
// quotalease.v1.CheckService and Envoy's RateLimitService. Each only
// translates: the request into admission.Requests, the Checker's results
// into its answer.
type Server struct{ c Config }

// New returns the check APIs of c.
func New(c Config) *Server { return &Server{c: c} }

// enforcedLimit is the limit an outcome enforced, in whole units per the
// policy's period: the policy's limit scaled by the share.
func enforcedLimit(o admission.Outcome) float64 {
	return o.Policy.Limit * float64(o.Limits.Amount()) / float64(o.Policy.Limits().Amount())
}
