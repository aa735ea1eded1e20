package rlqs

import "math"

// edgeSummary is what the Envoy instances streaming to this agent hold of
// one policy: renewals report it to the coordinator (QuotaRequest.edge),
// which shows it per region in `coordinator leases` and the console. It
// plays no part in any grant.
type edgeSummary struct {
	instances, buckets int   // streams with a bucket of the policy; their buckets
	library            int   // of the instances, the client library's
	assigned, usage    int64 // assigned refill and reported rate, amount units
}

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
