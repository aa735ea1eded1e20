package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// The demo's flags, help and exit codes; the demo itself runs in make demo
// (and its deployment in internal/testenv/cluster's tests).
func TestDemoBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cases := []struct {
		args []string
		code int
		text string
	}{
		{[]string{"--bin", "/nonexistent"}, 1, "make build"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"--duration", "soon"}, 2, "invalid value"},
		{[]string{"-h"}, 0, "Usage: quota-lease-demo"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if code := run(ctx, c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.text) {
			t.Errorf("%v: exit %d, stderr %q; want %d mentioning %q", c.args, code, errb.String(), c.code, c.text)
		}
	}
}
