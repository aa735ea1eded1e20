package cli

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// A command's -h keeps every word of a long description, in order, on
// lines no wider than UsageWidth, each under the description's indent.
func TestPrintFlagsWraps(t *testing.T) {
	long := strings.Repeat("a description that goes on ", 12) + "and-one-word-" + strings.Repeat("x", 120)
	var out bytes.Buffer
	fs := NewFlags("serve", "Usage: serve [flags]\n", &out)
	fs.String("region", "", long)
	fs.Bool("short", false, "short")
	if err := fs.Parse([]string{"-h"}); err != flag.ErrHelp {
		t.Fatalf("parse -h: %v", err)
	}
	text := out.String()
	if !strings.HasPrefix(text, "Usage: serve [flags]\n\nFlags:\n  -region string\n") {
		t.Fatalf("usage starts %q", text[:min(len(text), 80)])
	}
	var words []string
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if columns(l[:len(l)-len(strings.TrimLeft(l, " \t"))])+len(strings.TrimLeft(l, " \t")) > UsageWidth &&
			!strings.Contains(l, "xxxx") {
			t.Errorf("line wider than %d columns: %q", UsageWidth, l)
		}
		if strings.HasPrefix(l, "    \t") && !strings.Contains(l, "short") {
			words = append(words, strings.Fields(l)...)
		}
	}
	if got := strings.Join(words, " "); got != strings.TrimSpace(long) {
		t.Errorf("the description's words changed:\n got %q\nwant %q", got, long)
	}
}

// A command without flags prints no "Flags:" line.
func TestPrintFlagsNone(t *testing.T) {
	var out bytes.Buffer
	PrintFlags(&out, flag.NewFlagSet("x", flag.ContinueOnError))
	if out.Len() != 0 {
		t.Errorf("no flags printed %q", out.String())
	}
}
