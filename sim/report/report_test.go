package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// load reads one of the shipped scenarios.
func load(t *testing.T, name string) *scenario.Scenario {
	t.Helper()
	s, err := scenario.Load("../scenarios/" + name + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Same seed, same output, byte for byte: every file.
func TestDeterministic(t *testing.T) {
	for _, name := range []string{"coordinator-crash", "hot-tenant"} {
		s := load(t, name)
		a, b := t.TempDir(), t.TempDir()
		if _, err := RunToDir(s, a, true, nil); err != nil {
			t.Fatal(err)
		}
		s2 := load(t, name)
		if _, err := RunToDir(s2, b, true, nil); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"summary.json", "decisions.jsonl", "plot.svg", "modes.svg"} {
			x, _ := os.ReadFile(filepath.Join(a, f))
			y, _ := os.ReadFile(filepath.Join(b, f))
			if len(x) == 0 || !bytes.Equal(x, y) {
				t.Errorf("%s/%s differs between two runs (or is empty: %d bytes)", name, f, len(x))
			}
		}
	}
}

// A run's directory holds the decisions, the summary, the plots and the
// page, and the table names every way of limiting.
func TestOutputs(t *testing.T) {
	s := load(t, "trace-replay")
	dir := t.TempDir()
	var table bytes.Buffer
	res, err := RunToDir(s, dir, true, &table)
	if err != nil {
		t.Fatal(err)
	}
	dec, _ := os.ReadFile(filepath.Join(dir, "decisions.jsonl"))
	lines := strings.Split(strings.TrimSpace(string(dec)), "\n")
	if int64(len(lines)) != res.Mode("leased").Requests || len(lines) != 680 {
		t.Fatalf("%d decision lines, %d requests, trace has 680", len(lines), res.Mode("leased").Requests)
	}
	if !strings.HasPrefix(lines[0], `{"t_ms":10000,"region":"us","identity":"api=shared","cost":1,"allowed":`) {
		t.Fatalf("first decision %s", lines[0])
	}
	svg, _ := os.ReadFile(filepath.Join(dir, "plot.svg"))
	if !strings.HasPrefix(string(svg), "<svg") || !strings.Contains(string(svg), "bound") {
		t.Fatalf("plot.svg: %.80s", svg)
	}
	for _, want := range []string{"trace-replay", "leased", "static", "independent", "central"} {
		if !strings.Contains(table.String(), want) {
			t.Fatalf("the table lacks %q:\n%s", want, table.String())
		}
	}
	report, _ := os.ReadFile(filepath.Join(dir, "report.html"))
	for _, want := range []string{"<!doctype html>", "<h1>trace-replay</h1>", `<img src="plot.svg"`, "reference", "leased"} {
		if !strings.Contains(string(report), want) {
			t.Fatalf("report.html lacks %q:\n%s", want, report)
		}
	}
	if !strings.Contains(string(svg), "admitted per 1s (units)") || !strings.Contains(string(svg), ">100s<") {
		t.Fatalf("plot.svg lacks its y-axis label or round time ticks")
	}
	// Without decisions the same run writes the same summary and no
	// decisions.jsonl (nor leaves an older one behind).
	before, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if _, err := RunToDir(s, dir, false, nil); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if !bytes.Equal(before, after) {
		t.Fatal("the summary changed without decisions.jsonl")
	}
	if _, err := os.Stat(filepath.Join(dir, "decisions.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("decisions.jsonl after a run without decisions: %v", err)
	}
}

// A scenario of conversations (cost known after the response) adds their
// table: per mode, the tokens charged and those no counter counted.
func TestTableOfConversations(t *testing.T) {
	s := load(t, "llm-tokens")
	s.Duration = policy.Duration(time.Minute)
	res, err := sim.Run(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, res); err != nil || !strings.Contains(b.String(), "conversations") {
		t.Errorf("table without conversations (%v):\n%s", err, b.String())
	}
}

// Same seed, same edge: every output file byte for byte (a shortened
// run, with decisions).
func TestEdgeDeterministic(t *testing.T) {
	var outs [2][]byte
	for i := range outs {
		s := load(t, "edge-shift")
		s.Duration = policy.Duration(60 * time.Second)
		dir := t.TempDir()
		if _, err := RunToDir(s, dir, true, nil); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"summary.json", "decisions.jsonl", "report.html"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v (%d bytes)", f, err, len(b))
			}
			outs[i] = append(outs[i], b...)
		}
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two runs of edge-shift differ")
	}
	if !bytes.Contains(outs[0], []byte(`"mode":"edge"`)) || !bytes.Contains(outs[0], []byte(`"edge": {`)) {
		t.Fatal("the outputs lack the edge's decisions or summary")
	}
}
