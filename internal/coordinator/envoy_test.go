package coordinator

import (
	"strconv"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// An envoyproxy/ratelimit configuration is stored by quota set as the
// policies it maps to, with their Envoy match; a global limit too small
// to give each of the 3 regions one request is refused with what to do.
func TestEnvoyConfigStored(t *testing.T) {
	r := startReplica(t, testenv.Prefix(t), "a", nil)
	waitLeader(t, r)
	adm, _ := admin(t, r.addr)
	cfg := "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit: {unit: second, requests_per_unit: 500}\n"
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: cfg}); err != nil {
		t.Fatal(err)
	}
	got, err := adm.GetPolicy(t.Context(), &pb.GetPolicyRequest{Name: "mongo_cps.database_users"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.Json, `"domain":"mongo_cps"`) || !strings.Contains(got.Json, `"value":"users"`) {
		t.Fatalf("stored policy lacks its Envoy match:\n%s", got.Json)
	}
	small := "domain: sms\ndescriptors:\n  - key: to\n    rate_limit: {unit: day, requests_per_unit: 2}\n"
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: small}); err == nil || !strings.Contains(err.Error(), "raise") {
		t.Fatalf("2 per day shared by 3 regions: %v, want a refusal saying what to raise", err)
	}
}

// One quota set stores at most MaxPoliciesPerSet policies, all or none:
// a larger file is refused whole, with what to do, and stores nothing.
func TestQuotaSetAllOrNone(t *testing.T) {
	r := startReplica(t, testenv.Prefix(t), "a", nil)
	waitLeader(t, r)
	adm, _ := admin(t, r.addr)
	var b strings.Builder
	for i := 0; i <= MaxPoliciesPerSet; i++ {
		b.WriteString("---\nname: p" + strconv.Itoa(i) + "\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
	}
	if _, err := adm.SetPolicy(t.Context(), &pb.SetPolicyRequest{Yaml: b.String()}); err == nil || !strings.Contains(err.Error(), "split the file") {
		t.Fatalf("%d policies in one set: %v, want a refusal", MaxPoliciesPerSet+1, err)
	}
	list, err := adm.ListPolicies(t.Context(), &pb.ListPoliciesRequest{})
	if err != nil || len(list.Policies) != 0 {
		t.Fatalf("a refused set stored %d policies (%v)", len(list.Policies), err)
	}
}
