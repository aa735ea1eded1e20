package deploy

import (
	"testing"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"

	"github.com/quota-lease/quota-lease/policy"
)

// Every policy in docs/rlqs-server.md parses and validates as quota-lease
// reads it, and every bucket id builder as Envoy reads it, within a bucket's
// settings.
func TestRLQSServerDocBlocks(t *testing.T) {
	var policies, builders int
	for _, b := range yamlBlocks(t, "../docs/rlqs-server.md") {
		switch b.tag {
		case "policy":
			policies++
			ps, err := policy.ParsePolicies([]byte(b.body))
			if err != nil {
				t.Errorf("docs/rlqs-server.md:%d: %v", b.line, err)
			}
			for _, p := range ps {
				if p.Edge == nil {
					t.Errorf("docs/rlqs-server.md:%d: policy %s has no edge settings", b.line, p.Name)
				}
			}
		case "rlqs-bucket-id":
			builders++
			var s rlqfv3.RateLimitQuotaBucketSettings
			if err := parseYAML(b.body+"reporting_interval: 5s\n", &s); err != nil {
				t.Errorf("docs/rlqs-server.md:%d: %v", b.line, err)
			} else if err := validateDeep(&s); err != nil {
				t.Errorf("docs/rlqs-server.md:%d: %v", b.line, err)
			}
		}
	}
	if policies == 0 || builders == 0 {
		t.Fatalf("found %d policies and %d bucket id builders in docs/rlqs-server.md", policies, builders)
	}
}
