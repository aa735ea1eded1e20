package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// quota validate applies quota set's limits: a 5,000-policy file that set
// refuses (one etcd transaction holds at most 100) fails validation too,
// with the same advice, and a file of 100 passes.
func TestValidateAppliesSetLimits(t *testing.T) {
	write := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("---\nname: p" + strconv.Itoa(i) + "\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n")
		}
		path := filepath.Join(t.TempDir(), strconv.Itoa(n)+".yaml")
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if code, _, errs := runCmd(t, "quota", "validate", "-f", write(5000)); code != 1 || !strings.Contains(errs, "holds 5000 policies") || !strings.Contains(errs, "split the file") {
		t.Errorf("5,000 policies: exit %d, stderr %q; want exit 1 saying to split the file", code, errs)
	}
	if code, _, errs := runCmd(t, "quota", "validate", "-f", write(100)); code != 0 {
		t.Errorf("100 policies: exit %d: %s", code, errs)
	}
}

// A 10,000-character name is not echoed back whole: validate's error
// shows its start and its length.
func TestValidateCutsLongNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "long.yaml")
	if err := os.WriteFile(path, []byte("name: "+strings.Repeat("a", 10000)+"\nidentity: [tenant]\nlimit: 5\nperiod: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCmd(t, "quota", "validate", "-f", path)
	if code != 1 || len(errs) > 500 || !strings.Contains(errs, "(10000 bytes)") || !strings.Contains(errs, `field "name"`) {
		t.Errorf("exit %d, %d-byte stderr %.600q; want exit 1 and a short error naming the field", code, len(errs), errs)
	}
}
