package regional

import (
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

// FuzzStateKey: any attribute values give a key with exactly one hash tag
// holding the whole identity, or an error.
func FuzzStateKey(f *testing.F) {
	f.Add("acme", "/v1/{x}:y")
	f.Add("", "}")
	f.Fuzz(func(t *testing.T, tenant, route string) {
		p := &policy.Policy{Name: "api", Identity: []string{"tenant", "route"}}
		id, err := p.IdentityOf(map[string]string{"tenant": tenant, "route": route})
		if err != nil {
			return
		}
		key, err := StateKey(p, id)
		if err != nil {
			return
		}
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || len(key) > MaxKeyBytes {
			t.Fatalf("bad key %q", key)
		}
	})
}
