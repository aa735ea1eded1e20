package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
)

// The --edge-* flags (and their QUOTALEASE_EDGE_* variables) reach the
// agent's RLQS settings, the defaults without them; settings that cannot
// work are refused before the agent starts, naming the flags.
func TestEdgeFlags(t *testing.T) {
	edge := func(args ...string) (rlqs.Config, error) {
		o, err := serveFlags(append([]string{"--region", "us"}, args...), io.Discard)
		if err != nil {
			return rlqs.Config{}, err
		}
		sc, err := o.config(io.Discard)
		return sc.agent.Edge, err
	}
	if got, err := edge(); err != nil || got != rlqs.DefaultConfig() {
		t.Fatalf("without flags: %+v %v, want the defaults %+v", got, err, rlqs.DefaultConfig())
	}
	t.Setenv("QUOTALEASE_EDGE_REPORT_BURST", "50")
	got, err := edge("--edge-tick", "50ms", "--edge-grow-wait", "300ms", "--edge-margin", "1s", "--edge-change-every", "2s",
		"--edge-burst-fraction", "0.1", "--edge-abandon-after", "5m", "--edge-max-buckets", "500", "--edge-reports-per-second", "4")
	want := rlqs.DefaultConfig()
	want.Tick, want.GrowWait, want.Margin, want.ChangeEvery = 50*time.Millisecond, 300*time.Millisecond, time.Second, 2*time.Second
	want.BurstFraction, want.AbandonAfter, want.MaxBucketsPerStream, want.ReportsPerSecond, want.ReportBurst = 0.1, 5*time.Minute, 500, 4, 50
	if err != nil || got != want {
		t.Fatalf("with flags: %+v %v, want %+v", got, err, want)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--edge-tick", "300ms"}, "grow wait 500ms more than twice it"},
		{[]string{"--edge-burst-fraction", "1"}, "edge burst fraction 1 must be in (0, 1)"},
		{[]string{"--edge-max-buckets", "0"}, "max buckets per stream"},
		{[]string{"--edge-abandon-after", "100ms"}, "abandon-after 100ms at least it"},
	} {
		if _, err := edge(c.args...); err == nil || !strings.Contains(err.Error(), "--edge-* flags") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error about the --edge-* flags mentioning %q", c.args, err, c.want)
		}
	}
}
