package logs

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// A minute of failures every second is three lines: the first, one 30 s
// later with the count since, and the recovery with the total.
func TestOutagePacesItsLines(t *testing.T) {
	var out bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info})
	o := Outage{What: "etcd calls", Interval: 30 * time.Second, Level: hclog.Error}
	start := time.Unix(1000, 0)
	o.OK(log, start) // healthy: nothing to say
	for i := range 45 {
		o.Failed(log, start.Add(time.Duration(i)*time.Second), "endpoints", "http://127.0.0.1:1")
	}
	if !o.Since().Equal(start) {
		t.Fatalf("outage since %v, want %v", o.Since(), start)
	}
	o.OK(log, start.Add(45*time.Second))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "[ERROR] etcd calls failing") || !strings.Contains(lines[1], "etcd calls still failing") ||
		!strings.Contains(lines[1], "failures_since_last_line=30") || !strings.Contains(lines[2], "[INFO]  etcd calls recovered: after=45s failures=45") {
		t.Fatalf("paced lines:\n%s", out.String())
	}
	if !o.Since().IsZero() {
		t.Fatal("recovered outage still has a start")
	}
	out.Reset()
	o.Failed(log, start.Add(time.Minute)) // a new outage is logged at once
	if !strings.Contains(out.String(), "etcd calls failing") {
		t.Fatalf("second outage: %q", out.String())
	}
}
