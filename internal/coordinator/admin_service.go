package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// AdminService is the coordinator's AdminService: SREs' and tools' calls
// over a replica. Admin writes go through the leader, so the in-memory
// books and etcd change together; reads of policies and regions come from
// etcd and work on any replica.
type AdminService struct {
	pb.UnimplementedAdminServiceServer
	c *Coordinator
}

// policyRecord is p as the admin API answers it, with who manages it (src;
// nil: set by hand).
func policyRecord(p *policy.Policy, src *policySource) *pb.PolicyRecord {
	r := &pb.PolicyRecord{Name: p.Name, Version: p.Version, Json: mustJSON(p)}
	if src != nil {
		r.Source = src.String()
	}
	return r
}

// SetPolicy stores one or more policies: all or none, in one transaction.
func (s *AdminService) SetPolicy(ctx context.Context, req *pb.SetPolicyRequest) (*pb.SetPolicyResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := ParsePolicySet([]byte(req.Yaml))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := c.changePolicies(ctx, t, policyChange{set: ps}); err != nil {
		return nil, err
	}
	resp := &pb.SetPolicyResponse{}
	for _, p := range ps {
		resp.Policies = append(resp.Policies, policyRecord(p, nil))
	}
	return resp, nil
}

// GetPolicy returns one stored policy.
func (s *AdminService) GetPolicy(ctx context.Context, req *pb.GetPolicyRequest) (*pb.PolicyRecord, error) {
	c := s.c
	var txn *clientv3.TxnResponse
	if err := c.etcdCall(ctx, "read a policy", func(ctx context.Context) (err error) {
		txn, err = c.cli.Txn(ctx).
			Then(clientv3.OpGet(c.keys.policy(req.Name)), clientv3.OpGet(c.keys.source(req.Name))).
			Commit()
		return err
	}); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp, srcResp := txn.Responses[0].GetResponseRange(), txn.Responses[1].GetResponseRange()
	if len(resp.Kvs) == 0 {
		return nil, status.Errorf(codes.NotFound,
			"no policy %s; 'coordinator quota list' shows the stored ones", policy.QuoteName(req.Name))
	}
	var p policy.Policy
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
		return nil, status.Errorf(codes.Internal, "policy %q in etcd: %v", req.Name, err)
	}
	var src *policySource
	if len(srcResp.Kvs) > 0 {
		var err error
		if src, err = loadSource(srcResp.Kvs[0].Value); err != nil {
			return nil, status.Errorf(codes.Internal, "policy %q's source in etcd: %v", req.Name, err)
		}
	}
	return policyRecord(&p, src), nil
}

// ListPolicies returns every stored policy, by name.
func (s *AdminService) ListPolicies(ctx context.Context, _ *pb.ListPoliciesRequest) (*pb.ListPoliciesResponse, error) {
	c := s.c
	st, err := c.readState(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := &pb.ListPoliciesResponse{}
	for _, p := range st.policies {
		resp.Policies = append(resp.Policies, policyRecord(p, st.sources[p.Name]))
	}
	sort.Slice(resp.Policies, func(i, j int) bool { return resp.Policies[i].Name < resp.Policies[j].Name })
	return resp, nil
}

// DeletePolicy removes a policy and its ledger. Agents enforcing it get
// "unknown quota" on their next renewal and stop at their next policy
// reload; until its grants can no longer count, the leader keeps its book
// (leaderTerm.retired), so a policy recreated under the name meanwhile starts
// with them reserved.
func (s *AdminService) DeletePolicy(
	ctx context.Context,
	req *pb.DeletePolicyRequest,
) (*pb.DeletePolicyResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := c.changePolicies(ctx, t, policyChange{del: []string{req.Name}}); err != nil {
		return nil, err
	}
	return &pb.DeletePolicyResponse{}, nil
}

// ListLeases lists every region's lease on every quota, or one region's.
func (s *AdminService) ListLeases(ctx context.Context, req *pb.ListLeasesRequest) (*pb.ListLeasesResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	if req.Region != "" {
		if err := t.knownRegion(req.Region); err != nil {
			return nil, err
		}
	}
	t.mu.RLock()
	names := make([]string, 0, len(t.quotas))
	for n := range t.quotas {
		names = append(names, n)
	}
	quotas := t.quotas
	t.mu.RUnlock()
	sort.Strings(names)
	now, mono := c.cfg.Clock.Now(), c.cfg.Clock.Mono()
	resp := &pb.ListLeasesResponse{}
	for _, n := range names {
		q := quotas[n]
		q.mu.Lock()
		for _, s := range q.book.Statuses(now) {
			if req.Region != "" && s.Region != req.Region {
				continue
			}
			resp.Leases = append(resp.Leases, &pb.LeaseRecord{
				Quota:       n,
				Region:      s.Region,
				Instance:    s.Instance,
				GrantId:     s.GrantID,
				State:       string(s.State),
				Rate:        s.Amount,
				Enforcing:   s.Enforcing,
				Reserved:    s.Reserved,
				ExpiresInMs: max(0, s.ExpiresIn.Milliseconds()),
				Demand:      s.Demand,
				Limit:       q.book.Total(),
				Identities:  s.Identities,
				Edge:        q.edge.region(s.Region, mono),
			})
		}
		q.mu.Unlock()
	}
	return resp, nil
}

// ReleaseRegion drops a lapsed region's reserved degraded budget: the SRE
// asserts the region is down, so others may use its share.
func (s *AdminService) ReleaseRegion(
	ctx context.Context,
	req *pb.ReleaseRegionRequest,
) (*pb.ReleaseRegionResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	if err := t.knownRegion(req.Region); err != nil {
		return nil, err
	}
	t.mu.RLock()
	quotas := map[string]*quotaState{}
	for n, q := range t.quotas {
		if req.Quota == "" || n == req.Quota {
			quotas[n] = q
		}
	}
	t.mu.RUnlock()
	if req.Quota != "" && len(quotas) == 0 {
		return nil, status.Errorf(codes.NotFound, "no policy %s", policy.QuoteName(req.Quota))
	}
	now := c.cfg.Clock.Now()
	released := int32(0)
	for n, q := range quotas {
		q.mu.Lock()
		_, had := q.book.Demands()[req.Region]
		err := q.book.Release(req.Region, now)
		if err == nil && had {
			err = c.txn(ctx, t, clientv3.OpDelete(c.keys.ledgerEntry(n, req.Region)))
			released++
		}
		q.mu.Unlock()
		if errors.Is(err, lease.ErrStillLeased) {
			return nil, status.Errorf(codes.FailedPrecondition, "quota %s: %v; only a lapsed region can be released", n, err)
		}
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "quota %s: %v", n, err)
		}
	}
	c.log.Info("region released", "region", req.Region, "quota", req.Quota, "released", released)
	return &pb.ReleaseRegionResponse{Released: released}, nil
}

// SetRegion declares a region or changes its weight.
func (s *AdminService) SetRegion(ctx context.Context, req *pb.SetRegionRequest) (*pb.RegionRecord, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	if !policy.RegionNameRE.MatchString(req.Name) {
		return nil, status.Errorf(codes.InvalidArgument,
			"region name %s must be 1-63 characters of a-z, 0-9 and '-'", policy.QuoteName(req.Name))
	}
	if !(req.Weight > 0) || math.IsInf(req.Weight, 0) {
		return nil, status.Errorf(codes.InvalidArgument, "weight must be a positive finite number, got %v", req.Weight)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, exists := t.regions[req.Name]; !exists {
		names := []string{req.Name}
		for n := range t.regions {
			names = append(names, n)
		}
		for _, q := range t.quotas {
			if err := checkFloors(q.policy, names); err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "adding region %q: %v", req.Name, err)
			}
		}
	}
	rec := regionRecord{Name: req.Name, Weight: req.Weight}
	if err := c.txn(ctx, t, clientv3.OpPut(c.keys.region(req.Name), mustJSON(rec))); err != nil {
		return nil, status.Errorf(codes.Unavailable, "store region: %v", err)
	}
	t.regions[req.Name] = rec
	return &pb.RegionRecord{Name: rec.Name, Weight: rec.Weight}, nil
}

// ListRegions lists the declared regions.
func (s *AdminService) ListRegions(ctx context.Context, _ *pb.ListRegionsRequest) (*pb.ListRegionsResponse, error) {
	c := s.c
	st, err := c.readState(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := &pb.ListRegionsResponse{}
	for _, r := range st.regions {
		resp.Regions = append(resp.Regions, &pb.RegionRecord{Name: r.Name, Weight: r.Weight})
	}
	sort.Slice(resp.Regions, func(i, j int) bool { return resp.Regions[i].Name < resp.Regions[j].Name })
	return resp, nil
}

// Rebalance pauses, resumes or triggers rebalancing.
func (s *AdminService) Rebalance(ctx context.Context, req *pb.RebalanceRequest) (*pb.RebalanceResponse, error) {
	c := s.c
	t, err := c.leading(ctx)
	if err != nil {
		return nil, err
	}
	switch req.Action {
	case pb.RebalanceRequest_ACTION_NOW:
		select {
		case t.now <- struct{}{}:
		default:
		}
	case pb.RebalanceRequest_ACTION_PAUSE, pb.RebalanceRequest_ACTION_RESUME:
		paused := req.Action == pb.RebalanceRequest_ACTION_PAUSE
		if err := c.txn(ctx, t, clientv3.OpPut(c.keys.paused(), fmt.Sprint(paused))); err != nil {
			return nil, status.Errorf(codes.Unavailable, "store rebalance state: %v", err)
		}
		t.mu.Lock()
		t.paused = paused
		t.mu.Unlock()
		c.log.Info("rebalancing", "paused", paused)
	default:
		return nil, status.Error(codes.InvalidArgument, "action must be now, pause or resume")
	}
	return &pb.RebalanceResponse{Paused: t.isPaused()}, nil
}

func (t *leaderTerm) knownRegion(name string) error {
	t.mu.RLock()
	_, ok := t.regions[name]
	t.mu.RUnlock()
	if !ok {
		return status.Errorf(codes.NotFound, "unknown region %s (known: %s)",
			policy.QuoteName(name), strings.Join(t.regionNames(), ", "))
	}
	return nil
}

// GetBound returns the overshoot bound of every quota, or one: the worst
// case over one period with the declared regions, lease timing and drift,
// counting Redis outages (fallback) and failovers losing up to
// Config.StoreLag of writes as possible. It is the current epoch's
// steady bound, under the policy in force now; windows just after a change
// have the transition bound of docs/bound.md.
func (s *AdminService) GetBound(ctx context.Context, req *pb.GetBoundRequest) (*pb.GetBoundResponse, error) {
	c := s.c
	st, err := c.readState(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if req.Quota != "" && st.policies[req.Quota] == nil {
		return nil, status.Errorf(codes.NotFound, "no policy %s", policy.QuoteName(req.Quota))
	}
	d := bound.Deployment{Regions: max(1, len(st.regions)), Instances: 1, LeaseDuration: c.cfg.Timing.ValidFor,
		Drift: c.cfg.Timing.Drift, RedisOutages: true, StoreLag: c.cfg.StoreLag, ClockStep: c.cfg.RedisClockStep}
	names := make([]string, 0, len(st.policies))
	for n := range st.policies {
		if req.Quota == "" || n == req.Quota {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	resp := &pb.GetBoundResponse{}
	for _, n := range names {
		p := st.policies[n]
		r, err := bound.Compute(p, d, bound.Leased, 0)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "bound of %s: %v", n, err)
		}
		rec := &pb.BoundRecord{Quota: n, Limit: r.Limit, WindowSeconds: r.Window.Seconds(), WorstCase: r.WorstCase,
			Overshoot: r.Overshoot, OvershootRatio: r.Ratio, Terms: map[string]float64{}}
		for k, v := range r.Terms {
			if k != bound.TermReference {
				rec.Terms[k] = v
			}
		}
		resp.Bounds = append(resp.Bounds, rec)
	}
	return resp, nil
}
