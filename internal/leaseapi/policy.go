package leaseapi

import (
	"encoding/json"
	"fmt"

	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// DecodePolicies decodes the policies of the admin API's records (each
// carries its policy as JSON), in order.
func DecodePolicies(recs []*pb.PolicyRecord) ([]*policy.Policy, error) {
	out := make([]*policy.Policy, 0, len(recs))
	for _, r := range recs {
		var p policy.Policy
		if err := json.Unmarshal([]byte(r.Json), &p); err != nil {
			return nil, fmt.Errorf("policy %q: %w", r.Name, err)
		}
		out = append(out, &p)
	}
	return out, nil
}
