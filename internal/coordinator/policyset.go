package coordinator

import (
	"fmt"

	"github.com/quota-lease/quota-lease/policy"
)

// MaxPoliciesPerSet bounds the policies one SetPolicy stores: they are
// written in one etcd transaction, all or none, and etcd's default
// --max-txn-ops is 128.
const MaxPoliciesPerSet = 100

// ParsePolicySet parses a policy file as one quota set stores it: every
// policy valid, and at most MaxPoliciesPerSet of them. SetPolicy and the
// offline `quota validate` both use it, so a file validate passes is one
// set accepts, except for what only the leader knows (floors for regions
// not declared, changes of algorithm or shards to stored policies).
func ParsePolicySet(data []byte) ([]*policy.Policy, error) {
	ps, err := policy.ParsePolicyFile(data)
	if err != nil {
		return nil, err
	}
	if len(ps) > MaxPoliciesPerSet {
		return nil, fmt.Errorf("%w: the file holds %d policies; one quota set stores at most %d, all or none in "+
			"one etcd transaction: split the file and set each part",
			policy.ErrInvalidPolicy, len(ps), MaxPoliciesPerSet)
	}
	return ps, nil
}
