package coordinator

import (
	"encoding/json"

	"github.com/quota-lease/quota-lease/policy"
)

// policySource says who stores a policy: kept in etcd beside the policy
// (keys.source) for policies an xDS management server manages; a policy
// without one was set by hand (quota set).
type policySource struct {
	// Source is "xds".
	Source string `json:"source"`
	// Server and Node are the management server and the node id it was
	// subscribed to as.
	Server string `json:"server"`
	Node   string `json:"node"`
	// Resource is the RateLimitConfig the policy came from.
	Resource string `json:"resource"`
	// Version is the response's version_info that last changed the policy.
	Version string `json:"version"`
}

// sourceXDS is policySource.Source for a policy an xDS server manages.
const sourceXDS = "xds"

func (s *policySource) String() string {
	if s == nil {
		return "quota set"
	}
	return "xDS server " + s.Server + " (node " + s.Node + ", resource " + policy.QuoteName(s.Resource) +
		", version " + policy.QuoteName(s.Version) + ")"
}

// loadSource decodes a stored policySource.
func loadSource(b []byte) (*policySource, error) {
	var s policySource
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
