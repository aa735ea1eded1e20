package rlqs

import (
	"math"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// edgeCount is what the Envoy instances streaming to this agent hold of
// each policy they report buckets of, counted at one time: the summary
// renewals report to the coordinator (QuotaRequest.edge, shown per region
// in `coordinator leases` and the console; it plays no part in any
// grant) and the per-policy gauges (edgeGauges).
type edgeCount struct {
	at time.Time
	by map[string]*policyCount
}

// policyCount is one policy's part of an edgeCount.
type policyCount struct {
	streams map[uint64]bool // streams with a bucket of the policy: whether each is the client library's
	buckets int
	rate    float64        // the assigned buckets' refill, requests a second
	reserve float64        // this agent's reservations, units per period
	usage   float64        // the reported rate, amount units
	pol     *policy.Policy // nil: no longer served at the edge
}

// countEvery is how often the rounds count the edge for renewals (a
// scrape counts it again if the last count is over a second old): a
// count walks every bucket the agent serves.
const countEvery = 5 * time.Second

// amountOf is a sum of amounts, kept in a float64 so that it cannot wrap,
// as an amount: at most math.MaxInt64.
func amountOf(sum float64) int64 {
	if sum >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(sum)
}

func clampInt32(n int) int32 { return int32(min(n, math.MaxInt32)) }

// countTrue is how many of m's values are true.
func countTrue[K comparable](m map[K]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}
