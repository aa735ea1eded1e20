package cluster

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// BenchmarkIdle measures what an idle agent and its Redis cost: a policy
// served at the edge, no bucket, no check, for a minute; beside them, a
// redis-server with no client at all, the floor of any Redis (its own
// timer). CPU is counted in the kernel's 10 ms ticks, so a minute gives
// about 0.2 ms a second of resolution; wakeups are context switches of
// every thread (those of threads that ended between the two readings are
// lost, so the count is a floor).
func BenchmarkIdle(b *testing.B) {
	ctx := b.Context()
	c, err := Start(ctx, bins, b.TempDir(), Options{Regions: []string{"bench"}, Coordinators: 1, LeaseDuration: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Stop()
	if err := c.SetPolicies(ctx, edgeBenchConfig("edge", 100000, "{instances: 100, no_assignment: deny}")); err != nil {
		b.Fatal(err)
	}
	bare := redistest.Start(b)
	procs := []struct {
		name string
		pid  int
	}{{"agent", c.Agents[0].Pid()}, {"its redis-server", c.Redis[0].Pid()}, {"a redis-server alone", bare.Pid()}}
	const span = time.Minute
	for b.Loop() {
		time.Sleep(5 * time.Second) // past the policies' first leases
		cpu, sw := make([]time.Duration, len(procs)), make([]int64, len(procs))
		for i, p := range procs {
			cpu[i], sw[i] = processCPU(b, []int{p.pid}), contextSwitches(b, p.pid)
		}
		time.Sleep(span)
		var out strings.Builder
		for i, p := range procs {
			ms := float64((processCPU(b, []int{p.pid}) - cpu[i]).Microseconds()) / 1000 / span.Seconds()
			wakeups := float64(contextSwitches(b, p.pid)-sw[i]) / span.Seconds()
			fmt.Fprintf(&out, "\n%-22s %5.2f ms of CPU a second, %5.1f wakeups a second", p.name, ms, wakeups)
			if i == 0 {
				b.ReportMetric(ms, "agent-cpu-ms/s")
				b.ReportMetric(wakeups, "agent-wakeups/s")
			}
		}
		b.Logf("idle for %v, edge policies served:%s", span, out.String())
	}
}

// contextSwitches is how many times pid's threads gave up or were taken
// off a CPU so far (voluntary and not).
func contextSwitches(b testing.TB, pid int) int64 {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, t := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue // the thread ended
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.HasSuffix(k, "voluntary_ctxt_switches") {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			}
		}
	}
	return n
}
