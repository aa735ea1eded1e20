package leaseapi

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// The lease protocol's names and limits, shared by the coordinator that
// serves it and the agents that call it.
const (
	// LeaderTrailer is the gRPC trailer in which a follower names the
	// leader.
	LeaderTrailer = "quotalease-leader"
	// ClusterHeader carries a deployment's cluster ID: every coordinator
	// answer has it in its trailer, and a client that knows which cluster
	// it talks to sends it with every call, so that a stale address or
	// leader hint pointing into another deployment can never lead a write
	// there.
	ClusterHeader = "quotalease-cluster"
	// MaxQuotasPerRequest bounds the quotas one Lease request names;
	// agents split larger renewals.
	MaxQuotasPerRequest = 1000
	// MaxIdentityDemands bounds the identity demands one quota's renewal
	// reports; an agent sends the largest changes
	// (lease.DemandReport.Changes).
	MaxIdentityDemands = lease.MaxDemandChanges
	// MaxWholeDemands bounds a whole report of identity demands, what an
	// agent sends a coordinator that has not shown it takes changes
	// (QuotaGrant.identity_demand_taken): coordinators before changes
	// refuse a request with more.
	MaxWholeDemands = 1000
	// MaxRequestBytes bounds the quotas' encoded size in one Lease
	// request, well under the coordinator's 4 MiB limit on a message.
	MaxRequestBytes = 1 << 20
	// MaxAnswerBytes bounds an answer a client takes: a grant given whole
	// (to an agent that presents none) carries every identity share of
	// its quota, up to 100,000, more than gRPC's default 4 MiB.
	MaxAnswerBytes = 64 << 20
)

// ErrUnknownQuota reports a quota (policy) the coordinator does not have.
var ErrUnknownQuota = errors.New("unknown quota")

// ErrNoAnswer reports a quota the coordinator's answer left out.
var ErrNoAnswer = errors.New("the answer has no grant for this quota")

// Terms are what a grant carries besides its share: how long it holds and
// when to renew it, how long its degraded budget stays reserved, and which
// policy it was computed from.
type Terms struct {
	// RenewAfter is when the agent should renew, from its send time.
	RenewAfter time.Duration
	// DegradedTimeout is how long after the grant ends the coordinator
	// keeps its degraded budget reserved.
	DegradedTimeout time.Duration
	// Fingerprint is policy.Policy.Fingerprint of the policy the share
	// was computed from; an agent holding another reloads its policies.
	Fingerprint uint64
}

// EncodeGrant writes grant g of a quota with full limits into out: the
// share as rate and burst (capacity) in micro-units, the identity shares
// (whole, or as changes to base when base names a grant), and the terms.
func EncodeGrant(out *pb.QuotaGrant, full policy.Limits, g, base lease.Grant, t Terms) {
	l, _ := full.Share(g.Amount)
	out.GrantId, out.Rate, out.Burst, out.Total = g.ID, l.Rate, l.Capacity, g.Total
	out.IdentityAmounts = g.Identities
	if base.ID != "" {
		out.IdentityBase = base.ID
		out.IdentityAmounts, out.IdentityDefault = lease.DiffIdentities(base.Identities, g.Identities)
	}
	out.ValidForMs = g.ValidFor.Milliseconds()
	out.RenewAfterMs = t.RenewAfter.Milliseconds()
	if g.RenewAfter > 0 && g.RenewAfter < t.RenewAfter { // a shrink others wait for: acknowledge it soon
		out.RenewAfterMs = g.RenewAfter.Milliseconds()
	}
	out.DegradedTimeoutMs = t.DegradedTimeout.Milliseconds()
	out.PolicyFingerprint = t.Fingerprint
}

// EncodeError writes why a quota got no grant into out: the message, and
// a code for the lease package's sentinels (and ErrUnknownQuota).
func EncodeError(out *pb.QuotaGrant, err error) {
	out.Error = err.Error()
	switch {
	case errors.Is(err, ErrUnknownQuota):
		out.Code = pb.GrantError_GRANT_ERROR_UNKNOWN_QUOTA
	case errors.Is(err, lease.ErrStaleGrant):
		out.Code = pb.GrantError_GRANT_ERROR_STALE_GRANT
	case errors.Is(err, lease.ErrUnknownGrant):
		out.Code = pb.GrantError_GRANT_ERROR_UNKNOWN_GRANT
	case errors.Is(err, lease.ErrDuplicateInstance):
		out.Code = pb.GrantError_GRANT_ERROR_DUPLICATE_INSTANCE
	default:
		out.Code = pb.GrantError_GRANT_ERROR_UNSPECIFIED
	}
}

// ErrIdentityBase reports a grant whose identity shares change another
// grant than the one the agent presented.
var ErrIdentityBase = errors.New("the grant's identity shares change a grant this agent did not present")

// DecodeGrant reads g, the answer for a quota whose algorithm is alg, to a
// request that presented base: the grant (its amount in the quota's unit,
// policy.Limits.Amount; its identity shares whole, or base's changed as g
// says) and terms, or the refusal as an error wrapping the sentinel its
// code names.
func DecodeGrant(g *pb.QuotaGrant, alg policy.Algorithm, epoch int64, base lease.Grant) (lease.Grant, Terms, error) {
	if g.Error != "" || g.GrantId == "" {
		return lease.Grant{}, Terms{}, grantError(g)
	}
	amount := policy.Limits{Algorithm: alg, Rate: g.Rate, Capacity: g.Burst}.Amount()
	var ids map[string]int64
	for id, a := range g.IdentityAmounts {
		if ids == nil {
			ids = make(map[string]int64, len(g.IdentityAmounts))
		}
		ids[id] = max(a, 0)
	}
	if g.IdentityBase != "" {
		if g.IdentityBase != base.ID {
			return lease.Grant{}, Terms{}, fmt.Errorf("quota %s: grant %s changes %q, presented %q: %w",
				g.Quota, g.GrantId, g.IdentityBase, base.ID, ErrIdentityBase)
		}
		ids = lease.ApplyIdentities(base.Identities, ids, g.IdentityDefault)
	}
	grant := lease.Grant{
		ID:         g.GrantId,
		Amount:     amount,
		Identities: ids,
		Epoch:      epoch,
		ValidFor:   time.Duration(g.ValidForMs) * time.Millisecond,
		Total:      max(g.Total, 0),
	}
	terms := Terms{
		RenewAfter:      time.Duration(g.RenewAfterMs) * time.Millisecond,
		DegradedTimeout: time.Duration(g.DegradedTimeoutMs) * time.Millisecond,
		Fingerprint:     g.PolicyFingerprint,
	}
	return grant, terms, nil
}

// refusal is a refused grant: the coordinator's message, wrapping the
// sentinel of its code, so errors.Is works and the text is said once.
type refusal struct {
	quota, msg string
	base       error
}

func (r *refusal) Error() string { return "quota " + r.quota + ": " + r.msg }
func (r *refusal) Unwrap() error { return r.base }

func grantError(g *pb.QuotaGrant) error {
	var base error
	switch g.Code {
	case pb.GrantError_GRANT_ERROR_UNKNOWN_QUOTA:
		base = ErrUnknownQuota
	case pb.GrantError_GRANT_ERROR_STALE_GRANT:
		base = lease.ErrStaleGrant
	case pb.GrantError_GRANT_ERROR_UNKNOWN_GRANT:
		base = lease.ErrUnknownGrant
	case pb.GrantError_GRANT_ERROR_DUPLICATE_INSTANCE:
		base = lease.ErrDuplicateInstance
	}
	msg := g.Error
	if msg == "" {
		msg = "no grant and no reason"
	}
	return &refusal{quota: g.Quota, msg: msg, base: base}
}

// ByQuota indexes an answer's grants by quota name, so that each quota of
// a request is matched to its own answer whatever the order; a quota the
// answer leaves out gets ErrNoAnswer from Lookup.
type ByQuota map[string]*pb.QuotaGrant

// Index returns resp's grants by quota.
func Index(resp *pb.LeaseResponse) ByQuota {
	m := make(ByQuota, len(resp.GetGrants()))
	for _, g := range resp.GetGrants() {
		m[g.Quota] = g
	}
	return m
}

// Lookup returns quota's answer, or an error if the answer has none.
func (b ByQuota) Lookup(quota string) (*pb.QuotaGrant, error) {
	g, ok := b[quota]
	if !ok {
		return nil, fmt.Errorf("quota %s: %w", quota, ErrNoAnswer)
	}
	return g, nil
}

// Part is the quotas [Start, End) of a renewal sent in one request.
type Part struct{ Start, End int }

// Split cuts a renewal's quotas into requests of at most
// MaxQuotasPerRequest quotas and MaxRequestBytes encoded bytes (a quota
// larger than that alone goes in a request of its own), in order.
func Split(quotas []*pb.QuotaRequest) []Part {
	var parts []Part
	start, size := 0, 0
	for i, q := range quotas {
		n := proto.Size(q)
		if i > start && (i-start == MaxQuotasPerRequest || size+n > MaxRequestBytes) {
			parts = append(parts, Part{start, i})
			start, size = i, 0
		}
		size += n
	}
	if start < len(quotas) {
		parts = append(parts, Part{start, len(quotas)})
	}
	return parts
}
