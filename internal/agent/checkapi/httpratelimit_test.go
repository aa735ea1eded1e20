package checkapi

import (
	"bytes"
	"crypto/sha256"
	"net/http"
	"reflect"
	"testing"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

// The numbers every version reports of an outcome: the enforced share
// rounded down, the window and reset rounded up, the remaining never
// negative, a Retry-After only when refused.
func TestLimitFieldsOf(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1500ms\n")
	full := p.Limits()
	half := full
	half.Rate = full.Rate * 3 / 4 // a share of 7.5 per period
	for _, c := range []struct {
		name string
		o    admission.Outcome
		want httplimit.Fields
	}{
		{"admitted", admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: 4*policy.Micro + 999_999, ResetAfterMs: 1001}, Policy: p, Limits: full},
			httplimit.Fields{Policy: "api", Limit: 10, Window: 2, Remaining: 4, Reset: 2}},
		{"refused, a share", admission.Outcome{Decision: policy.Decision{Remaining: 0, RetryAfterMs: 1, ResetAfterMs: 1400}, Policy: p, Limits: half},
			httplimit.Fields{Policy: "api", Limit: 7, Window: 2, Remaining: 0, Reset: 2, RetryAfter: 1}},
		{"negative remaining", admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: -3 * policy.Micro}, Policy: p, Limits: full},
			httplimit.Fields{Policy: "api", Limit: 10, Window: 2}},
	} {
		if got := limitFieldsOf(c.o); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	pk := partitionKey(p, map[string]string{"tenant": "acme corp"})
	if want := sha256.Sum256([]byte("tenant=acme%20corp")); !bytes.Equal(pk, want[:]) {
		t.Errorf("partition key %x, want SHA-256 of the escaped identity %x", pk, want)
	}
	if pk := partitionKey(&policy.Policy{Name: "all"}, map[string]string{"tenant": "acme"}); pk != nil {
		t.Errorf("a policy without identity attributes has partition key %x", pk)
	}
}

// BenchmarkLimitFields: what each version's fields cost an answer, on
// their own (no Redis), in one run for a ratio: draft-11 also computes the
// partition key (the identity again and its SHA-256).
func BenchmarkLimitFields(b *testing.B) {
	p := testenv.MustPolicy(b, "name: api-per-tenant\nidentity: [tenant]\nlimit: 50\nperiod: 1s\n")
	o := admission.Outcome{Decision: policy.Decision{Allowed: true, Remaining: 41 * policy.Micro, ResetAfterMs: 180}, Policy: p, Limits: p.Limits()}
	attrs := map[string]string{"tenant": "acme"}
	for _, mode := range []string{httplimit.Draft06, httplimit.Draft11} {
		b.Run(mode, func(b *testing.B) {
			a := New(Config{Answers: Answers{HTTPRateLimitHeaders: mode}})
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				clear(h)
				a.writeLimitFields(h, o, attrs)
			}
		})
	}
}
