package testenv

import (
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// MustPolicies parses and validates the policies of yaml (documents
// separated by "---"), failing the test if any is invalid.
func MustPolicies(t testing.TB, yaml string) []*policy.Policy {
	t.Helper()
	ps, err := policy.ParsePolicies([]byte(yaml))
	if err != nil {
		t.Fatalf("parse policies: %v", err)
	}
	return ps
}

// MustPolicy parses and validates the one policy of yaml, failing the test
// if it is invalid or yaml holds more or fewer than one.
func MustPolicy(t testing.TB, yaml string) *policy.Policy {
	t.Helper()
	ps := MustPolicies(t, yaml)
	if len(ps) != 1 {
		t.Fatalf("parse policy: %d policies, want 1", len(ps))
	}
	return ps[0]
}
