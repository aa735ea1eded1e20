package regional

import (
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/policy"
)

func TestIdentityEscapingKeepsHashTag(t *testing.T) {
	p := &policy.Policy{Name: "api", Version: 3, Identity: []string{"tenant", "route"}}
	id, err := p.IdentityOf(map[string]string{"tenant": "a}b{c", "route": "/v1/x:y,z=1 %"})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := StateKey(p, id)
	want := "rl:{api:tenant=a%7Db%7Bc,route=/v1/x%3Ay%2Cz%3D1%20%25}:v3"
	if key != want {
		t.Fatalf("key %s, want %s", key, want)
	}
	// Exactly one '{' and one '}', so the Cluster hash tag is the whole identity.
	if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 {
		t.Fatalf("key %s has stray braces", key)
	}
	// Distinct attribute values never collide.
	a, _ := p.IdentityOf(map[string]string{"tenant": "x,route=y", "route": "z"})
	b, _ := p.IdentityOf(map[string]string{"tenant": "x", "route": "y,route=z"})
	if a == b {
		t.Fatalf("identities collide: %s", a)
	}
}
