package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// LeaderTrailer is the gRPC trailer in which a follower names the leader.
const LeaderTrailer = "quotalease-leader"

// Limits on a lease request.
const (
	// MaxQuotasPerRequest bounds the quotas one Lease request names;
	// agents split larger renewals.
	MaxQuotasPerRequest = 1000
	maxNameBytes        = 128
)

// leading returns the current term for a handler that needs the leader,
// or an UNAVAILABLE error naming the leader (also in LeaderTrailer).
func (c *Coordinator) leading(ctx context.Context) (*term, error) {
	t := c.term()
	if t != nil && t.lease.valid(c.cfg.Clock.Mono()) {
		return t, nil
	}
	leader, _ := c.leader.Load().(string)
	if t != nil || leader == c.cfg.Advertise {
		leader = ""
	}
	if leader == "" {
		return nil, status.Error(codes.Unavailable, "no leader confirmed yet (election or failover in progress); retry shortly")
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderTrailer, leader))
	return nil, status.Errorf(codes.Unavailable, "not the leader; the leader is at %s", leader)
}

// Lease grants or renews a region's leases on a set of quotas.
func (c *Coordinator) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	t.serving.RLock()
	defer t.serving.RUnlock()
	if c.term() != t { // stepped down while we waited
		return nil, status.Error(codes.Unavailable, "leadership changed; retry")
	}
	if err := c.validateLease(t, req); err != nil {
		return nil, err
	}
	now := c.cfg.Clock.Now()

	// Lock the named quotas in name order (no deadlock between requests).
	type item struct {
		req     *pb.QuotaRequest
		q       *quota
		pending *lease.Pending
		grant   *pb.QuotaGrant
	}
	items := make([]*item, len(req.Quotas))
	for i, qr := range req.Quotas {
		items[i] = &item{req: qr, grant: &pb.QuotaGrant{Quota: qr.Quota}}
	}
	order := append([]*item(nil), items...)
	sort.Slice(order, func(i, j int) bool { return order[i].req.Quota < order[j].req.Quota })
	t.mu.RLock()
	for _, it := range order {
		it.q = t.quotas[it.req.Quota]
	}
	t.mu.RUnlock()
	for _, it := range order {
		if it.q != nil {
			it.q.mu.Lock()
			defer it.q.mu.Unlock()
		}
	}

	var ops, lowerOps []clientv3.Op // lowerings go first (see below)
	type mark struct {
		q      *quota
		region string
		amount int64
	}
	var lowered []mark
	for _, it := range items {
		switch {
		case it.q == nil:
			it.grant.Error = fmt.Sprintf("unknown quota %q", it.req.Quota)
			it.grant.Code = pb.GrantError_GRANT_ERROR_UNKNOWN_QUOTA
			continue
		case it.q.policy.Scope == policy.ScopeRegion:
			fill(it.grant, it.q, lease.Grant{ID: "region", Amount: it.q.full.Amount(), Epoch: t.epoch, ValidFor: c.cfg.Timing.ValidFor}, c.cfg.Timing)
			continue
		}
		// No region can use more than the whole quota: a larger demand is
		// capped there, so an inflated report cannot weigh more than that.
		demand := min(max(it.req.Demand, 0), it.q.book.Total())
		r := lease.Renewal{Region: req.Region, Instance: req.Instance, Nonce: req.Nonce, Seq: it.req.Seq, GrantID: it.req.GrantId, Demand: demand}
		p, err := it.q.book.Prepare(now, r, lease.Target(it.q.policy, it.q.targets, req.Region, demand))
		if err != nil {
			it.grant.Error, it.grant.Code = err.Error(), grantErrorCode(err)
			continue
		}
		it.pending = p
		if p.NeedsPersist() {
			g := p.Grant()
			ops = append(ops, clientv3.OpPut(c.keys.ledgerEntry(it.req.Quota, req.Region),
				mustJSON(ledgerRecord{Instance: req.Instance, Nonce: req.Nonce, GrantID: g.ID, Amount: p.Persisted(), Epoch: t.epoch})))
			// Raising one mark, lower the others that shrank, in the same
			// transaction: then the marks sum to at most the quota at every
			// committed state, so a successor that restores them all at
			// once books no more than the total.
			for region, amount := range it.q.book.Shrunk(now) {
				if region == req.Region {
					continue
				}
				lowerOps = append(lowerOps, c.markOp(t, it.req.Quota, it.q.book, region, amount))
				lowered = append(lowered, mark{it.q, region, amount})
			}
		}
	}
	if len(ops) > 0 {
		// Lowerings before raisings: should the batch be split into several
		// transactions and the leader die between them, etcd holds lowered
		// marks (still at least what each region may enforce) and no raise
		// of a grant that was never answered.
		if err := c.txn(ctx, t, append(lowerOps, ops...)...); err != nil {
			if errors.Is(err, errNotLeader) {
				return nil, status.Error(codes.Unavailable, "leadership changed; retry")
			}
			return nil, status.Errorf(codes.Unavailable, "could not record the grants in etcd: %v; retry", err)
		}
		for _, m := range lowered {
			m.q.book.MarkPersisted(m.region, m.amount)
		}
	}
	// No grant may leave after the leadership lease could have ended; the
	// etcd write above may have taken a while. (Marks it wrote stay at least
	// what each region may enforce, and sum to at most the quota.)
	if !t.lease.valid(c.cfg.Clock.Mono()) {
		return nil, status.Error(codes.Unavailable, "leadership not confirmed in time; retry")
	}
	resp := &pb.LeaseResponse{Epoch: t.epoch, Grants: make([]*pb.QuotaGrant, len(items))}
	for i, it := range items {
		if it.pending != nil {
			it.q.book.Commit(it.pending)
			fill(it.grant, it.q, it.pending.Grant(), c.cfg.Timing)
		}
		resp.Grants[i] = it.grant
	}
	c.grants.Add(1)
	return resp, nil
}

// fill writes grant g of quota q into the wire form: the share as rate and
// burst (capacity) in micro-units.
func fill(out *pb.QuotaGrant, q *quota, g lease.Grant, t lease.Timing) {
	l, _ := q.full.Share(g.Amount)
	out.GrantId, out.Rate, out.Burst = g.ID, l.Rate, l.Capacity
	out.ValidForMs = g.ValidFor.Milliseconds()
	out.PolicyVersion = q.policy.Version
	out.PolicyFingerprint = q.fp
	out.RenewAfterMs = t.RenewAfter().Milliseconds()
	out.DegradedTimeoutMs = t.DegradedTimeout.Milliseconds()
}

func (c *Coordinator) validateLease(t *term, req *pb.LeaseRequest) error {
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
	case len(req.Quotas) == 0 || len(req.Quotas) > MaxQuotasPerRequest:
		return bad("a request names 1-%d quotas, got %d", MaxQuotasPerRequest, len(req.Quotas))
	}
	seen := make(map[string]bool, len(req.Quotas))
	for _, q := range req.Quotas {
		if seen[q.Quota] {
			return bad("quota %q is named twice", q.Quota)
		}
		seen[q.Quota] = true
	}
	return nil
}

func grantErrorCode(err error) pb.GrantError {
	switch {
	case errors.Is(err, lease.ErrStaleGrant):
		return pb.GrantError_GRANT_ERROR_STALE_GRANT
	case errors.Is(err, lease.ErrUnknownGrant):
		return pb.GrantError_GRANT_ERROR_UNKNOWN_GRANT
	case errors.Is(err, lease.ErrDuplicateInstance):
		return pb.GrantError_GRANT_ERROR_DUPLICATE_INSTANCE
	default:
		return pb.GrantError_GRANT_ERROR_UNSPECIFIED
	}
}

// GrantErr turns a refused QuotaGrant back into an error that wraps the
// lease package's sentinel, for agents.
func GrantErr(g *pb.QuotaGrant) error {
	if g.Error == "" {
		return nil
	}
	var base error
	switch g.Code {
	case pb.GrantError_GRANT_ERROR_STALE_GRANT:
		base = lease.ErrStaleGrant
	case pb.GrantError_GRANT_ERROR_UNKNOWN_GRANT:
		base = lease.ErrUnknownGrant
	case pb.GrantError_GRANT_ERROR_DUPLICATE_INSTANCE:
		base = lease.ErrDuplicateInstance
	default:
		return fmt.Errorf("quota %s: %s", g.Quota, g.Error)
	}
	return fmt.Errorf("quota %s: %s: %w", g.Quota, g.Error, base)
}
