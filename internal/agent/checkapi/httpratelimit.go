package checkapi

import (
	"crypto/sha256"
	"math"
	"net/http"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/policy"
)

// limitFieldsOf is what the RateLimit fields report of o.
func limitFieldsOf(o admission.Outcome) httplimit.Fields {
	f := httplimit.Fields{
		Policy:    o.Policy.Name,
		Limit:     int64(math.Floor(enforcedLimit(o))),
		Window:    httplimit.SecondsUp(time.Duration(o.Policy.Period).Milliseconds()),
		Remaining: max(0, o.RemainingUnits()),
		Reset:     httplimit.SecondsUp(o.ResetAfterMs),
	}
	if !o.Allowed {
		f.RetryAfter = httplimit.RetryAfterSecs(o.RetryAfterMs)
	}
	return f
}

// partitionKey is the partition key draft-11 sends for a check of p with
// attrs: the SHA-256 of its identity as policy.IdentityOf writes it (for
// example "tenant=acme"), so a client can compute the key of a request it
// is about to send, and no tenant name or address is sent back. nil for a
// policy without identity attributes, which counts every request as one.
func partitionKey(p *policy.Policy, attrs map[string]string) []byte {
	if len(p.Identity) == 0 {
		return nil
	}
	id, err := p.IdentityOf(attrs)
	if err != nil { // unreachable: the check was decided under this identity
		return nil
	}
	sum := sha256.Sum256([]byte(id))
	return sum[:]
}

// writeLimitFields sets the RateLimit fields of the version the agent was
// configured with, for the check of attrs decided as o.
func (s *Server) writeLimitFields(h http.Header, o admission.Outcome, attrs map[string]string) {
	v := s.c.Answers.HTTPRateLimitHeaders
	if v == httplimit.None {
		return
	}
	f := limitFieldsOf(o)
	if v == httplimit.Draft11 {
		f.Partition = partitionKey(o.Policy, attrs)
	}
	httplimit.Write(h, v, f)
}
