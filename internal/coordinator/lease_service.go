package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// LeaseService is the coordinator's LeaseService: the regional agents'
// renewals, answered by the leader.
type LeaseService struct {
	pb.UnimplementedLeaseServiceServer
	c *Coordinator
}

// maxNameBytes bounds a lease request's instance name and nonce.
const maxNameBytes = 128

// leading returns the current term for a handler that needs the leader,
// or an UNAVAILABLE error naming the leader (also in LeaderTrailer).
func (c *Coordinator) leading(ctx context.Context) (*leaderTerm, error) {
	t := c.currentTerm()
	if t != nil && t.lease.valid(c.cfg.Clock.Mono()) {
		return t, nil
	}
	leader := c.Leader()
	if t != nil || leader == c.cfg.Advertise {
		leader = ""
	}
	if problem := c.etcd.problem(); problem != nil && leader == "" {
		return nil, status.Errorf(codes.Unavailable, "no leader: this coordinator cannot elect or confirm one: %v", problem)
	}
	if leader == "" {
		return nil, status.Error(codes.Unavailable,
			"no leader confirmed yet: the replicas elect one through etcd, which takes up to --session-ttl "+
				"after a start or a leader's death; retry shortly (if it lasts, the replicas' logs and /readyz say why)")
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(leaseapi.LeaderTrailer, leader))
	return nil, status.Errorf(codes.Unavailable, "not the leader; the leader is at %s", leader)
}

// Lease grants or renews a region's leases on a set of quotas: while
// leading, it validates the request, locks the quotas, prepares a grant for
// each, writes the ledger changes they need, checks that it still leads,
// and commits.
func (s *LeaseService) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	t.serving.RLock()
	defer t.serving.RUnlock()
	if c.currentTerm() != t { // stepped down while we waited
		return nil, status.Error(codes.Unavailable, "leadership changed; retry")
	}
	if err := validateLease(t, req); err != nil {
		return nil, err
	}
	if ok, heldFor := t.claims.take(req.Region, req.Instance, req.Nonce, req.Replaces, c.cfg.Clock.Mono()); !ok {
		return nil, c.refuse(pb.LeaseService_Lease_FullMethodName, "instance-held",
			leaseapi.InstanceHeldError(req.Region, req.Instance, heldFor))
	}
	items := t.lockQuotas(req)
	defer unlockQuotas(items)
	now := c.cfg.Clock.Now()
	var writes []ledgerWrite
	for _, it := range items {
		if d := s.prepare(t, now, req, it); !d.Empty() {
			writes = append(writes, ledgerWrite{it.req.Quota, it.q.book, d})
		}
	}
	if err := c.writeLedger(ctx, t, writes...); err != nil {
		if errors.Is(err, errNotLeader) {
			return nil, status.Error(codes.Unavailable, "leadership changed; retry")
		}
		return nil, status.Errorf(codes.Unavailable, "could not record the grants in etcd: %v; retry", err)
	}
	// No grant may leave after the leadership lease could have ended; the
	// etcd write above may have taken a while. (Marks it wrote stay at least
	// what each region may enforce, and sum to at most the quota.)
	if !t.lease.valid(c.cfg.Clock.Mono()) {
		return nil, status.Error(codes.Unavailable, "leadership not confirmed in time; retry")
	}
	resp := &pb.LeaseResponse{Epoch: t.epoch, Grants: make([]*pb.QuotaGrant, len(items)), AssumedDrift: c.cfg.Timing.Drift}
	for i, it := range items {
		if it.pending != nil {
			it.q.book.Commit(it.pending)
			var base lease.Grant
			if b, ok := it.pending.Base(); ok && it.req.IdentityDeltas {
				base = b
			}
			leaseapi.EncodeGrant(it.grant, it.q.full, it.pending.Grant(), base, s.terms(it.q))
		}
		resp.Grants[i] = it.grant
	}
	c.grants.Add(1)
	return resp, nil
}

// leaseItem is one quota of a Lease request on its way to an answer.
type leaseItem struct {
	req     *pb.QuotaRequest
	q       *quotaState // nil for an unknown quota
	pending *lease.Pending
	grant   *pb.QuotaGrant
}

// lockQuotas resolves the quotas req names and locks them in name order,
// so that two requests never wait on each other; the items are in req's
// order.
func (t *leaderTerm) lockQuotas(req *pb.LeaseRequest) []*leaseItem {
	items := make([]*leaseItem, len(req.Quotas))
	for i, qr := range req.Quotas {
		items[i] = &leaseItem{req: qr, grant: &pb.QuotaGrant{Quota: qr.Quota}}
	}
	order := append([]*leaseItem(nil), items...)
	sort.Slice(order, func(i, j int) bool { return order[i].req.Quota < order[j].req.Quota })
	t.mu.RLock()
	for _, it := range order {
		it.q = t.quotas[it.req.Quota]
	}
	t.mu.RUnlock()
	for _, it := range order {
		if it.q != nil {
			it.q.mu.Lock()
		}
	}
	return items
}

func unlockQuotas(items []*leaseItem) {
	for _, it := range items {
		if it.q != nil {
			it.q.mu.Unlock()
		}
	}
}

// prepare computes its answer at now without committing it: a refusal, a
// region-scoped quota's whole limit, or a pending grant (it.pending) and
// the ledger change it needs first.
func (s *LeaseService) prepare(t *leaderTerm, now time.Time, req *pb.LeaseRequest, it *leaseItem) lease.LedgerDelta {
	c := s.c
	switch {
	case it.q == nil:
		leaseapi.EncodeError(it.grant, fmt.Errorf("%w %q", leaseapi.ErrUnknownQuota, it.req.Quota))
		return lease.LedgerDelta{}
	case it.q.policy.Scope == policy.ScopeRegion:
		whole := lease.Grant{ID: "region", Amount: it.q.full.Amount(), Epoch: t.epoch, ValidFor: c.cfg.Timing.ValidFor}
		leaseapi.EncodeGrant(it.grant, it.q.full, whole, lease.Grant{}, s.terms(it.q))
		return lease.LedgerDelta{}
	}
	// No region can use more than the whole quota: a larger demand is
	// capped there, so an inflated report cannot weigh more than that.
	demand := min(max(it.req.Demand, 0), it.q.book.Total())
	r := lease.Renewal{
		Region:   req.Region,
		Instance: req.Instance,
		Nonce:    req.Nonce,
		Seq:      it.req.Seq,
		GrantID:  it.req.GrantId,
		Demand:   demand,
	}
	known := it.q.ids.Update(req.Region, req.Instance, req.Nonce, int(it.req.IdentityDemandHeld),
		capDemands(it.req.IdentityDemand, it.q.book.Total()))
	it.grant.IdentityDemandTaken, it.grant.IdentityDemandReset = true, !known
	it.q.edge.record(req.Region, req.Instance, it.req.Edge, c.cfg.Clock.Mono(), c.cfg.Timing.ValidFor)
	aim := lease.Targets{
		Default:    lease.Target(it.q.policy, it.q.targets, req.Region, demand),
		Identities: it.q.ids.Targets(req.Region),
	}
	p, err := it.q.book.PrepareTargets(now, r, aim)
	if err != nil {
		leaseapi.EncodeError(it.grant, err)
		return lease.LedgerDelta{}
	}
	it.pending = p
	return p.Ledger()
}

// capDemands caps every identity demand at the quota's total, as the
// region's demand is: no report can weigh more than the whole quota.
func capDemands(d map[string]int64, total int64) map[string]int64 {
	out := make(map[string]int64, len(d))
	for id, v := range d {
		out[id] = min(max(v, 0), total)
	}
	return out
}

// terms are the terms of q's grants: renewal after a third of the agent's
// validity (as this coordinator's timing assumes agents compute it), the
// degraded budget's reservation, and the policy's fingerprint.
func (s *LeaseService) terms(q *quotaState) leaseapi.Terms {
	t := s.c.cfg.Timing
	return leaseapi.Terms{RenewAfter: t.RenewAfter(), DegradedTimeout: t.DegradedTimeout, Fingerprint: q.fp}
}

func validateLease(t *leaderTerm, req *pb.LeaseRequest) error {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, format, args...)
	}
	t.mu.RLock()
	_, known := t.regions[req.Region]
	t.mu.RUnlock()
	switch {
	case !known:
		return bad("unknown region %q (known: %s); declare it with 'coordinator regions set-weight %s 1'",
			req.Region, strings.Join(t.regionNames(), ", "), req.Region)
	case req.Instance == "" || len(req.Instance) > maxNameBytes:
		return bad("instance must be 1-%d bytes", maxNameBytes)
	case req.Nonce == "" || len(req.Nonce) > maxNameBytes:
		return bad("nonce must be 1-%d bytes", maxNameBytes)
	case len(req.Replaces) > maxNameBytes:
		return bad("replaces must be at most %d bytes", maxNameBytes)
	case len(req.Quotas) == 0 || len(req.Quotas) > leaseapi.MaxQuotasPerRequest:
		return bad("a request names 1-%d quotas, got %d", leaseapi.MaxQuotasPerRequest, len(req.Quotas))
	}
	seen := make(map[string]bool, len(req.Quotas))
	for _, q := range req.Quotas {
		if seen[q.Quota] {
			return bad("quota %q is named twice", q.Quota)
		}
		seen[q.Quota] = true
		if len(q.IdentityDemand) > leaseapi.MaxIdentityDemands {
			return bad("quota %q: at most %d identity demands, got %d",
				q.Quota, leaseapi.MaxIdentityDemands, len(q.IdentityDemand))
		}
		for id := range q.IdentityDemand {
			if id == "" || len(id) > policy.MaxIdentityBytes {
				return bad("quota %q: an identity must be 1-%d bytes", q.Quota, policy.MaxIdentityBytes)
			}
		}
		if !validEdge(q.Edge) {
			return bad("quota %q: the edge summary's counts and amounts must not be negative", q.Quota)
		}
	}
	return nil
}
