package leaseapi

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

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
	// reports; an agent sends the hottest.
	MaxIdentityDemands = 1000
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
// share as rate and burst (capacity) in micro-units, and the terms.
func EncodeGrant(out *pb.QuotaGrant, full policy.Limits, g lease.Grant, t Terms) {
	l, _ := full.Share(g.Amount)
	out.GrantId, out.Rate, out.Burst = g.ID, l.Rate, l.Capacity
	out.IdentityAmounts = g.Identities
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

// DecodeGrant reads g, the answer for a quota whose algorithm is alg: the
// grant (its amount in the quota's unit, policy.Limits.Amount) and terms,
// or the refusal as an error wrapping the sentinel its code names.
func DecodeGrant(g *pb.QuotaGrant, alg policy.Algorithm, epoch int64) (lease.Grant, Terms, error) {
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
	return lease.Grant{ID: g.GrantId, Amount: amount, Identities: ids, Epoch: epoch, ValidFor: time.Duration(g.ValidForMs) * time.Millisecond},
		Terms{RenewAfter: time.Duration(g.RenewAfterMs) * time.Millisecond, DegradedTimeout: time.Duration(g.DegradedTimeoutMs) * time.Millisecond,
			Fingerprint: g.PolicyFingerprint}, nil
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

// Hottest returns the n largest entries of demands (all of them when there
// are no more than n), ties broken by name, so a report stays bounded.
func Hottest(demands map[string]int64, n int) map[string]int64 {
	if len(demands) <= n {
		return demands
	}
	ids := make([]string, 0, len(demands))
	for id := range demands {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int { return cmp.Or(cmp.Compare(demands[b], demands[a]), cmp.Compare(a, b)) })
	out := make(map[string]int64, n)
	for _, id := range ids[:n] {
		out[id] = demands[id]
	}
	return out
}
