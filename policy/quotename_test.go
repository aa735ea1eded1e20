package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestQuoteNameCutsLongNames(t *testing.T) {
	if got := QuoteName("api-per-tenant"); got != `"api-per-tenant"` {
		t.Errorf("short name: %s", got)
	}
	if got := QuoteName(strings.Repeat("a", 10000)); got != `"`+strings.Repeat("a", 64)+`"... (10000 bytes)` {
		t.Errorf("long name: %s", got)
	}
	if got := QuoteName("a" + strings.Repeat("é", 100)); !strings.HasPrefix(got, `"aééé`) || !strings.HasSuffix(got, `é"... (201 bytes)`) {
		t.Errorf("long name cut inside a rune: %s", got)
	}
}

// A policy file with a 10,000-character name (or algorithm, or attribute)
// is refused with an error of a few hundred bytes that still names the
// field at fault.
func TestLongNamesAreCutInErrors(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for field, doc := range map[string]string{
		"name":      "name: " + long + "\nidentity: [tenant]\nlimit: 5\nperiod: 1s\n",
		"algorithm": "name: api\nidentity: [tenant]\nlimit: 5\nperiod: 1s\nalgorithm: " + long + "\n",
		"identity":  "name: api\nidentity: [" + long + "]\nlimit: 5\nperiod: 1s\n",
		"floors":    "name: api\nidentity: [tenant]\nlimit: 5\nperiod: 1s\nfloors:\n  ? " + long + "\n  : 1\n",
		"period":    "name: api\nidentity: [tenant]\nlimit: 5\nperiod: " + long + "\n",
		"mode":      "name: api\nidentity: [tenant]\nlimit: 5\nperiod: 1s\nfailure: {mode: " + long + "}\n",
	} {
		_, err := ParsePolicyFile([]byte(doc))
		if err == nil || !errors.Is(err, ErrInvalidPolicy) && field != "period" {
			t.Errorf("%s: %v", field, err)
			continue
		}
		if msg := err.Error(); len(msg) > 400 || !strings.Contains(msg, "(10000 bytes)") {
			t.Errorf("%s: %d-byte error: %.500s", field, len(msg), msg)
		}
	}
}
