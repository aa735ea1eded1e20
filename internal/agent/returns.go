package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// returnedUnits counts returned hits by what became of them.
func returnedUnits() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotalease_agent_returned_units_total",
		Help: "Units returned (Envoy's is_negative_hits) to a policy that accepts returns, by policy and " +
			"result: freed (given back to the limit), " +
			"cleared (matched what the limit no longer counted: a refused request's hits, units taken in an " +
			"earlier window, or refilled), unmatched (more than the identity held), " +
			"dropped (not decided: no share, or Redis could not decide it; the units stay counted until they leave " +
			"the window or are refilled)."},
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
