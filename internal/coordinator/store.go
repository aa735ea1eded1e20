package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quota-lease/quota-lease/policy"
)

// etcd layout, under Config.Prefix:
//
//	/policies/<name>           policy, JSON (normalized)
//	/policy-sources/<name>     policySource, JSON: who manages the policy, when not quota set
//	/regions/<name>            regionRecord, JSON
//	/ledger/<quota>/<region>   ledgerRecord, JSON: the most the region may enforce
//	/control/rebalance-paused  "true" or "false"
//	/election/                 leader election (concurrency.Election)
type keys struct{ prefix string }

func (k keys) policies() string          { return k.prefix + "/policies/" }
func (k keys) policy(name string) string { return k.policies() + name }
func (k keys) sources() string           { return k.prefix + "/policy-sources/" }
func (k keys) source(name string) string { return k.sources() + name }
func (k keys) regions() string           { return k.prefix + "/regions/" }
func (k keys) region(name string) string { return k.regions() + name }
func (k keys) ledger() string            { return k.prefix + "/ledger/" }
func (k keys) ledgerQuota(q string) string {
	return k.ledger() + q + "/"
}
func (k keys) ledgerEntry(q, region string) string { return k.ledgerQuota(q) + region }
func (k keys) paused() string                      { return k.prefix + "/control/rebalance-paused" }
func (k keys) election() string                    { return k.prefix + "/election/" }
func (k keys) clusterID() string                   { return k.prefix + "/cluster-id" }

// regionRecord is a declared region.
type regionRecord struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
}

// ledgerRecord is the durable part of a region's lease on a quota.
type ledgerRecord struct {
	Instance string `json:"instance"`
	Nonce    string `json:"nonce"`
	GrantID  string `json:"grant_id"`
	// Amount is the most the region may be enforcing (a high-water mark).
	Amount int64 `json:"amount"`
	// Total is the largest total the region's grants were issued under,
	// which its degraded budget follows (lease.Grant.Total); absent in
	// records of older coordinators: the policy's total then.
	Total int64 `json:"total,omitempty"`
	Epoch int64 `json:"epoch"`
}

// state is everything a new leader loads from etcd.
type state struct {
	policies map[string]*policy.Policy
	sources  map[string]*policySource
	regions  map[string]regionRecord
	ledger   map[string]map[string]ledgerRecord // quota -> region -> record
	paused   bool
	rev      int64
}

func loadState(ctx context.Context, cli *clientv3.Client, k keys) (*state, error) {
	resp, err := cli.Get(ctx, k.prefix+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("load state from etcd: %w", err)
	}
	s := &state{
		policies: map[string]*policy.Policy{},
		sources:  map[string]*policySource{},
		regions:  map[string]regionRecord{},
		ledger:   map[string]map[string]ledgerRecord{},
		rev:      resp.Header.Revision,
	}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case strings.HasPrefix(key, k.policies()):
			var p policy.Policy
			if err := json.Unmarshal(kv.Value, &p); err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", key, err)
			}
			s.policies[p.Name] = &p
		case strings.HasPrefix(key, k.sources()):
			src, err := loadSource(kv.Value)
			if err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", key, err)
			}
			s.sources[strings.TrimPrefix(key, k.sources())] = src
		case strings.HasPrefix(key, k.regions()):
			var r regionRecord
			if err := json.Unmarshal(kv.Value, &r); err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", key, err)
			}
			s.regions[r.Name] = r
		case strings.HasPrefix(key, k.ledger()):
			q, region, ok := strings.Cut(strings.TrimPrefix(key, k.ledger()), "/")
			if !ok {
				continue
			}
			var l ledgerRecord
			if err := json.Unmarshal(kv.Value, &l); err != nil {
				return nil, fmt.Errorf("etcd key %s: %w", key, err)
			}
			if s.ledger[q] == nil {
				s.ledger[q] = map[string]ledgerRecord{}
			}
			s.ledger[q][region] = l
		case key == k.paused():
			s.paused = string(kv.Value) == "true"
		}
	}
	return s, nil
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return string(b)
}
