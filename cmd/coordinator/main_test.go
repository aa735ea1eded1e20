package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestQuotaValidate(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"quota", "validate", "-f", "../../examples/policies.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"api-per-tenant", "login-per-ip", "sliding_log", "static-share"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"quota", "validate", "-f", "../../examples/policies.yaml", "-o", "json"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "[") {
		t.Fatalf("json: exit %d: %s", code, out.String())
	}
}

func TestQuotaValidateBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: x\nidentity: [tenant]\nlimit: .nan\nperiod: 1s\n"), 0o644)
	cases := []struct {
		args []string
		code int
		text string
	}{
		{[]string{"quota", "validate", "-f", bad}, 1, `field "limit"`},
		{[]string{"quota", "validate", "-f", "/does/not/exist"}, 1, "no such file"},
		{[]string{"quota", "validate"}, 2, "Usage"},
		{[]string{"quota", "validate", "-f", bad, "-o", "xml"}, 2, "Usage"},
		{[]string{"nonsense"}, 2, "unknown command"},
		{nil, 2, "Commands:"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.text) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errb.String(), c.code, c.text)
		}
	}
}
