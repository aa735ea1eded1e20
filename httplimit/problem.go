package httplimit

import "strconv"

// ProblemRateLimited is the problem type of a 429.
const ProblemRateLimited = "urn:quota-lease:problem:rate-limited"

// AppendRateLimited appends the problem of a request policy refused
// (RFC 9457, application/problem+json), as the agent's HTTP API answers
// it. policy must need no JSON escaping: a policy name
// ([a-z0-9._-]).
func AppendRateLimited(b []byte, policy string, retryAfterMs int64) []byte {
	b = append(b, `{"type":"`+ProblemRateLimited+`","title":"Too Many Requests","status":429,"detail":"policy `...)
	b = append(b, policy...) // [a-z0-9._-] (policy.Policy.Validate): nothing to escape
	b = append(b, ` admits no more now; retry after `...)
	b = strconv.AppendFloat(b, float64(retryAfterMs)/1000, 'f', -1, 64)
	b = append(b, `s","policy":"`...)
	b = append(b, policy...)
	b = append(b, '"')
	if retryAfterMs != 0 {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, retryAfterMs, 10)
	}
	return append(b, "}\n"...)
}
