package agent

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Returned hits (Envoy's is_negative_hits, RateLimitDescriptor field 4:
// "the hits_addend value will be treated as negative", which Envoy sets
// from a rate limit action's hits_addend.is_negative_hits, typically on
// one applied on stream done, so that a request's end gives back what its
// start took). The descriptor's hits_addend, else the request's, is how
// many; 0 means the policy's default cost, as for a charge.
//
// Only a policy that accepts returns (policy.Policy.Returns) takes them
// (admission.Request.Return says what a return frees); a call returning
// hits to any other limit fails whole with INVALID_ARGUMENT, nothing
// charged (ShouldRateLimit). A returning descriptor is answered OK, never
// OVER_LIMIT, in any mode: with its limit and what remains after the
// return when the return was decided, else (unmatched, or dropped because
// Redis could not decide it) OK with no limit.

// envoyReturnStatus is the answer to a descriptor returning hits, decided
// with result r.
func envoyReturnStatus(cfg *Config, r admission.Result) *rlsv3.RateLimitResponse_DescriptorStatus {
	if r.Err != nil || r.Policy == nil || r.Via != admission.ViaStore && r.Via != admission.ViaReplay {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return envoyStatus(cfg, r).st // allowed: OK, its limit, what remains
}

// returnedUnits counts returned hits by what became of them.
func returnedUnits() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_returned_units_total",
		Help: "Units returned (Envoy's is_negative_hits) to a policy that accepts returns, by policy and result: freed (given back to the limit), " +
			"cleared (matched what the limit no longer counted: a refused request's hits, units taken in an earlier window, or refilled), unmatched (more than the identity held), " +
			"dropped (not decided: no share, or Redis could not decide it; the units stay counted until they leave the window or are refilled)."},
		[]string{"policy", "result"})
}

// observeReturn counts return t, decided as o.
func (m *metrics) observeReturn(t admission.Ticket, o admission.Outcome) {
	if o.Via != admission.ViaStore {
		m.returned.WithLabelValues(t.Policy.Name, "dropped").Add(float64(t.Cost))
		return
	}
	for _, c := range []struct {
		result string
		micro  int64
	}{{"freed", o.Freed}, {"cleared", o.Matched - o.Freed}, {"unmatched", t.Cost*policy.Micro - o.Matched}} {
		if c.micro > 0 {
			m.returned.WithLabelValues(t.Policy.Name, c.result).Add(policy.Units(c.micro))
		}
	}
}
