package leaseapi

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A grant survives the wire: the amount (a token bucket's rate, a window's
// per-window limit) and the terms decode to what was encoded.
func TestGrantRoundTrip(t *testing.T) {
	for _, full := range []policy.Limits{
		{Algorithm: policy.TokenBucket, Capacity: 200 * policy.Micro, Rate: 100 * policy.Micro},
		{Algorithm: policy.FixedWindow, Capacity: 60 * policy.Micro, WindowMs: 60_000},
		{Algorithm: policy.SlidingLog, Capacity: 7 * policy.Micro, WindowMs: 1000},
	} {
		g := lease.Grant{ID: "3.17", Amount: full.Amount() / 3, Epoch: 3, ValidFor: 10 * time.Second}
		terms := Terms{RenewAfter: 3 * time.Second, DegradedTimeout: 10 * time.Minute, Fingerprint: 42}
		var out pb.QuotaGrant
		EncodeGrant(&out, full, g, terms)
		got, gotTerms, err := DecodeGrant(&out, full.Algorithm, 3)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, g) || gotTerms != terms {
			t.Fatalf("%s: %+v %+v, want %+v %+v", full.Algorithm, got, gotTerms, g, terms)
		}
	}
}

// A refusal decodes to an error that wraps its sentinel and says the
// coordinator's reason once.
func TestRefusalSaysItOnce(t *testing.T) {
	for _, err := range []error{fmt.Errorf("%w %q", ErrUnknownQuota, "api"), fmt.Errorf("grant 1.1: %w", lease.ErrStaleGrant),
		lease.ErrUnknownGrant, lease.ErrDuplicateInstance} {
		out := pb.QuotaGrant{Quota: "api"}
		EncodeError(&out, err)
		_, _, got := DecodeGrant(&out, policy.TokenBucket, 1)
		if !errors.Is(got, errors.Unwrap(err)) && !errors.Is(got, err) {
			t.Errorf("%v decoded to %v, which does not wrap its sentinel", err, got)
		}
		if strings.Count(got.Error(), err.Error()) != 1 {
			t.Errorf("%q says %q other than once", got, err)
		}
	}
}

// Grants are matched by quota name, whatever the order, and a quota the
// answer leaves out is an error.
func TestIndexByQuota(t *testing.T) {
	resp := &pb.LeaseResponse{Grants: []*pb.QuotaGrant{{Quota: "b", GrantId: "1"}, {Quota: "a", GrantId: "2"}}}
	ix := Index(resp)
	if g, err := ix.Lookup("a"); err != nil || g.GrantId != "2" {
		t.Fatalf("a: %v %v", g, err)
	}
	if _, err := ix.Lookup("c"); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("c: %v, want ErrNoAnswer", err)
	}
}
