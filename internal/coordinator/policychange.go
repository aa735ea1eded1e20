package coordinator

import (
	"context"
	"sort"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/policy"
)

// policyChange is one change of the stored policies, written all or none
// (in one etcd transaction up to 100 operations): what quota set, quota
// delete and an xDS response make. Every rule of storing a policy is here,
// whoever asks.
type policyChange struct {
	set []*policy.Policy
	del []string
	// source of the policies set: nil for by hand.
	source func(name string) *policySource
	// replace deletes and recreates a policy whose algorithm or scope
	// changes (its outstanding grants reserved in the new one, as quota
	// delete then quota set do) instead of refusing the change.
	replace bool
}

// byHand reports whether the change is an SRE's (quota set or delete).
func (ch policyChange) byHand() bool { return ch.source == nil }

// changePolicies checks ch against the term's policies, writes it and
// applies it to the books. The caller holds t.mu. Its errors are gRPC
// statuses: Unavailable when etcd could not take the change, another code
// when ch itself cannot be made (nothing is written then).
func (c *Coordinator) changePolicies(ctx context.Context, t *leaderTerm, ch policyChange) error {
	regions := make([]string, 0, len(t.regions))
	for n := range t.regions {
		regions = append(regions, n)
	}
	sort.Strings(regions)
	var ops []clientv3.Op
	recreated := map[string]bool{}
	for _, p := range ch.set {
		if err := c.owns(t, ch, p.Name); err != nil {
			return err
		}
		if err := checkFloors(p, regions); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if old := t.quotas[p.Name]; old != nil {
			if old.policy.Algorithm != p.Algorithm || old.policy.Scope != p.Scope {
				if !ch.replace {
					return status.Errorf(codes.FailedPrecondition,
						"policy %q: changing algorithm or scope in place would mix units of outstanding grants; delete the "+
							"policy first or use a new name", p.Name)
				}
				recreated[p.Name] = true
				ops = append(ops, clientv3.OpDelete(c.keys.ledgerQuota(p.Name), clientv3.WithPrefix()))
			} else if old.policy.ShardCount() != p.ShardCount() && old.policy.Version == p.Version {
				// The new parts would start full beside the kept part 0: a
				// burst the bound counts only as a config change.
				return status.Errorf(codes.FailedPrecondition,
					"policy %q: changing shards (%d to %d) starts the new parts full; change the version with it (now "+
						"%d), which starts every key afresh as the bound's burst term counts",
					p.Name, old.policy.ShardCount(), p.ShardCount(), p.Version)
			}
		}
		ops = append(ops, clientv3.OpPut(c.keys.policy(p.Name), mustJSON(p)))
		if src := ch.sourceOf(p.Name); src != nil {
			ops = append(ops, clientv3.OpPut(c.keys.source(p.Name), mustJSON(src)))
		} else if t.sources[p.Name] != nil {
			ops = append(ops, clientv3.OpDelete(c.keys.source(p.Name)))
		}
	}
	for _, name := range ch.del {
		if t.quotas[name] == nil {
			return status.Errorf(codes.NotFound, "no policy %s", policy.QuoteName(name))
		}
		if err := c.owns(t, ch, name); err != nil {
			return err
		}
		ops = append(ops, clientv3.OpDelete(c.keys.policy(name)),
			clientv3.OpDelete(c.keys.ledgerQuota(name), clientv3.WithPrefix()))
		if t.sources[name] != nil {
			ops = append(ops, clientv3.OpDelete(c.keys.source(name)))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	if err := c.txn(ctx, t, ops...); err != nil {
		return status.Errorf(codes.Unavailable, "store policies: %v", err)
	}
	for _, name := range ch.del {
		c.retire(t, name)
		delete(t.sources, name)
		c.log.Info("policy deleted", "name", name, "by", ch.sourceOf(name).String())
	}
	for _, p := range ch.set {
		if recreated[p.Name] {
			c.retire(t, p.Name)
		}
		if q := t.quotas[p.Name]; q != nil {
			q.mu.Lock()
			q.setPolicy(p)
			q.mu.Unlock()
		} else {
			nq := newQuota(p, c.cfg.Timing, t.epoch)
			if old := t.retired[p.Name]; old != nil {
				old.mu.Lock()
				n := nq.inherit(old, c.cfg.Clock.Now())
				old.mu.Unlock()
				delete(t.retired, p.Name)
				c.log.Info("recreated policy starts with the deleted one's live grants reserved", "name", p.Name, "regions", n)
			}
			t.quotas[p.Name] = nq
		}
		src := ch.sourceOf(p.Name)
		if src != nil {
			t.sources[p.Name] = src
		} else {
			delete(t.sources, p.Name)
		}
		c.log.Info("policy stored", "name", p.Name, "version", p.Version, "by", src.String())
	}
	return nil
}

// sourceOf is the source ch stores name under: nil by hand.
func (ch policyChange) sourceOf(name string) *policySource {
	if ch.source == nil {
		return nil
	}
	return ch.source(name)
}

// owns checks that ch may change policy name: an SRE may not change a
// policy an xDS server manages while this coordinator subscribes to one
// (without a subscription, the policies it left are the SRE's), and an xDS
// server may not take over a policy set by hand.
func (c *Coordinator) owns(t *leaderTerm, ch policyChange, name string) error {
	src := t.sources[name]
	switch {
	case ch.byHand() && src != nil && c.cfg.RateLimitXDS != nil:
		return status.Errorf(codes.FailedPrecondition,
			"policy %s is managed by %s; change it there (quota set and delete change such a policy only on "+
				"coordinators run without --ratelimit-xds)", policy.QuoteName(name), src)
	case !ch.byHand() && src == nil && t.quotas[name] != nil:
		return status.Errorf(codes.FailedPrecondition,
			"policy %s was set by hand (quota set); the xDS server may not replace it: delete it ('coordinator "+
				"quota delete %s') or give the limit another name (rate_limit.name)", policy.QuoteName(name), name)
	}
	return nil
}

// retire moves a deleted policy's quota to the retired books, where its
// grants stay reserved until they end (leaderTerm.retired).
func (c *Coordinator) retire(t *leaderTerm, name string) {
	if q := t.quotas[name]; q != nil {
		t.retired[name] = q
		delete(t.quotas, name)
	}
}
