package leaseapi

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

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
		EncodeGrant(&out, full, g, lease.Grant{}, terms)
		got, gotTerms, err := DecodeGrant(&out, full.Algorithm, 3, lease.Grant{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, g) || gotTerms != terms {
			t.Fatalf("%s: %+v %+v, want %+v %+v", full.Algorithm, got, gotTerms, g, terms)
		}
	}
}

// Identity shares sent as changes to the grant the agent presented decode
// to the whole set; changes to another grant are refused, and the wire
// carries only what changed.
func TestIdentityShareDeltas(t *testing.T) {
	full := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 10 * policy.Micro, Rate: 10 * policy.Micro}
	base := lease.Grant{ID: "1.4", Amount: 3, Identities: map[string]int64{"a": 9, "b": 5, "c": 1}}
	next := lease.Grant{ID: "1.5", Amount: 3, Epoch: 1, ValidFor: time.Second, Identities: map[string]int64{"a": 9, "b": 7, "d": 2}}
	var out pb.QuotaGrant
	EncodeGrant(&out, full, next, base, Terms{})
	if len(out.IdentityAmounts) != 2 || !reflect.DeepEqual(out.IdentityDefault, []string{"c"}) || out.IdentityBase != "1.4" {
		t.Fatalf("on the wire: %v, default %v, base %q; want b and d changed, c back to the default, based on 1.4", out.IdentityAmounts, out.IdentityDefault, out.IdentityBase)
	}
	got, _, err := DecodeGrant(&out, full.Algorithm, 1, base)
	if err != nil || !reflect.DeepEqual(got, next) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, next)
	}
	if base.Identities["c"] != 1 || len(base.Identities) != 3 {
		t.Fatal("decoding changed the base grant's shares")
	}
	if _, _, err := DecodeGrant(&out, full.Algorithm, 1, lease.Grant{ID: "1.3"}); !errors.Is(err, ErrIdentityBase) {
		t.Fatalf("changes to another grant: %v, want ErrIdentityBase", err)
	}
	// Every identity back to the default: nil, as a grant that never had any.
	EncodeGrant(&out, full, lease.Grant{ID: "1.6", Amount: 3, Epoch: 1, ValidFor: time.Second}, next, Terms{})
	if got, _, err := DecodeGrant(&out, full.Algorithm, 1, next); err != nil || got.Identities != nil {
		t.Fatalf("all back to the default: %v, %v", got.Identities, err)
	}
}

// A refusal decodes to an error that wraps its sentinel and says the
// coordinator's reason once.
func TestRefusalSaysItOnce(t *testing.T) {
	for _, err := range []error{fmt.Errorf("%w %q", ErrUnknownQuota, "api"), fmt.Errorf("grant 1.1: %w", lease.ErrStaleGrant),
		lease.ErrUnknownGrant, lease.ErrDuplicateInstance} {
		out := pb.QuotaGrant{Quota: "api"}
		EncodeError(&out, err)
		_, _, got := DecodeGrant(&out, policy.TokenBucket, 1, lease.Grant{})
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

// A renewal is cut by quota count and by encoded size, in order, and
// every quota is sent exactly once.
func TestSplitRenewal(t *testing.T) {
	big := map[string]int64{}
	for i := 0; i < MaxIdentityDemands; i++ {
		big[strings.Repeat("x", 200)+fmt.Sprint(i)] = int64(i)
	}
	var quotas []*pb.QuotaRequest
	for i := 0; i < 2500; i++ {
		q := &pb.QuotaRequest{Quota: fmt.Sprint("q", i)}
		if i%500 == 7 {
			q.IdentityDemand = big // about 430 KB
		}
		quotas = append(quotas, q)
	}
	next := 0
	for _, p := range Split(quotas) {
		if p.Start != next || p.End <= p.Start {
			t.Fatalf("part %+v after %d", p, next)
		}
		size := 0
		for _, q := range quotas[p.Start:p.End] {
			size += proto.Size(q)
		}
		if p.End-p.Start > MaxQuotasPerRequest || (size > MaxRequestBytes && p.End-p.Start > 1) {
			t.Fatalf("part %+v: %d quotas, %d bytes", p, p.End-p.Start, size)
		}
		next = p.End
	}
	if next != len(quotas) {
		t.Fatalf("sent %d of %d quotas", next, len(quotas))
	}
}
