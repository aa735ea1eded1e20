package cluster

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// robustnessRun is one seed's outcome, for the table.
type robustnessRun struct {
	seed     uint64
	failure  string
	faults   map[FaultKind]int
	sent     int64
	errors   int64
	admitted int
	modes    map[string]int64
	verdict  Verdict
}

// robustnessSeeds are the seeds `make test` runs; `make robustness` runs
// SEEDS of them (1..N) for DURATION each, or just SEED.
func robustnessSeeds(t *testing.T) ([]uint64, time.Duration) {
	dur := 25 * time.Second
	if v := os.Getenv("QUOTALEASE_ROBUSTNESS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("QUOTALEASE_ROBUSTNESS_DURATION=%q: want a duration of at least 10s", v)
		}
		dur = d
	}
	if v := os.Getenv("QUOTALEASE_ROBUSTNESS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("QUOTALEASE_ROBUSTNESS_SEED=%q: want a number", v)
		}
		return []uint64{s}, dur
	}
	seeds := []uint64{1, 2}
	if v := os.Getenv("QUOTALEASE_ROBUSTNESS_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("QUOTALEASE_ROBUSTNESS_SEEDS=%q: want a positive count", v)
		}
		seeds = seeds[:0]
		for i := 1; i <= n; i++ {
			seeds = append(seeds, uint64(i))
		}
	}
	return seeds, dur
}

// failureModes are the policies' failure modes, one per seed in turn.
var failureModes = []struct{ name, yaml string }{
	{"static-share", "{mode: static-share, static_fraction: 0.1}"},
	{"fail-closed", "{mode: fail-closed}"},
	{"fail-open", "{mode: fail-open, open_fraction: 0.2}"},
}

// TestRobustness runs real processes (etcd, two coordinators, three
// regions with their Redis and agents) under a random fault schedule per
// seed: leaders killed and paused, agents killed, Redis restarted empty,
// paused in short cycles and slowed around the check timeout, regions
// partitioned, limits raised and lowered, failure modes switched (also
// while a leader is down or a region cut off); beside the changing policy,
// a token budget charged after the fact (tokensPolicy). The checker recounts each
// identity's admissions in every window from the client's records and
// compares each with the bound of the policies in force then (the
// transition bound around changes). Print a seed's schedule with -v; run
// one again with `make robustness SEED=N`.
func TestRobustness(t *testing.T) {
	testenv.SkipMultiProcess(t)
	seeds, dur := robustnessSeeds(t)
	var runs []robustnessRun
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			runs = append(runs, robustnessSeed(t, seed, dur))
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-5s %-12s %-50s %7s %6s %8s %9s %6s %s\n", "seed", "failure", "faults run", "checks", "errors", "admitted", "worst/bnd", "viol.", "worst window")
	for _, r := range runs {
		fmt.Fprintf(&b, "%-5d %-12s %-50s %7d %6d %8d %9.2f %6d %s\n", r.seed, r.failure, faultSummary(r.faults), r.sent, r.errors, r.admitted,
			r.verdict.Worst.Ratio(), r.verdict.Violations, fmt.Sprintf("%d of %.1f (%d policies)", r.verdict.Worst.Count, r.verdict.Worst.Bound, r.verdict.Worst.Policies))
	}
	t.Log(b.String())
}

func faultSummary(m map[FaultKind]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s:%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// initialLimit is the policy's limit before any change-limit fault.
const initialLimit = 15

// tokensPolicy is a token budget charged after the fact (docs/post-hoc.md),
// run beside the changing policy under the same faults; the gateway
// driving it keeps its max_in_flight (Conversations).
const tokensPolicy = `name: robust-tokens
identity: [tenant]
algorithm: fixed_window
limit: 100
period: 1s
post_hoc: true
max_cost: 20
max_in_flight: 8
failure: {mode: static-share, static_fraction: 0.1}
`

func robustnessSeed(t *testing.T, seed uint64, dur time.Duration) robustnessRun {
	// The seed picks the failure mode the run starts with; change-failure
	// faults switch to the others.
	first := int(seed) % len(failureModes)
	var failures []string
	for i := range failureModes {
		failures = append(failures, failureModes[(first+i)%len(failureModes)].yaml)
	}
	policy := func(limit float64, failure string) string {
		return fmt.Sprintf("name: robust\nidentity: [tenant]\nlimit: %v\nperiod: 1s\nburst: %v\nfailure: %s\n", limit, limit, failure)
	}
	c := start(t, policy(initialLimit, failures[0])+"---\n"+tokensPolicy)
	faults := Schedule(seed, dur, []string{"us", "eu", "ap"})
	for _, f := range faults {
		t.Logf("scheduled %s", f)
	}
	in := NewInjector(c, policy, initialLimit, failures)
	in.Logf = t.Logf
	d := NewDriver(c)
	ctx, cancel := context.WithTimeout(t.Context(), dur+time.Minute)
	defer cancel()
	begin := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); in.Run(ctx, begin, faults) }()
	// The hot tenant sends 126/s, several times any bound the limits
	// (5 to 30/s) give, so a system that limited nothing would fail.
	load := steady("robust", "tenant", 4, 0.7, map[string]float64{"us": 60, "eu": 60, "ap": 60})
	// Tenants with a home, which get shares of their own: one in us, one in
	// eu, and one that moves home every 20 s, each at 40/s.
	homed := Load{Policy: "robust", Attribute: "tenant", Rate: func(string, time.Duration) float64 { return 40 },
		Identity: func(region string, el time.Duration) string {
			if region == []string{"us", "eu", "ap"}[int(el/(20*time.Second))%3] {
				return "mover"
			}
			return "home-" + region
		}}
	// A token budget charged after the fact, by one tenant from every
	// region: about 300 tokens a second asked of 100, so its windows run
	// out and what is in flight then is charged beyond them.
	tokens := Load{Policy: "robust-tokens", Attribute: "tenant", Identities: 1, Rate: func(string, time.Duration) float64 { return 10 },
		Conversations: &Conversations{MaxCost: 20, MaxInFlight: 8, Think: 300 * time.Millisecond}}
	d.Run(ctx, dur, load, homed, tokens)
	<-done

	history := append([]PolicyChange{{Policy: policyOf(t, policy(initialLimit, failures[0]))}}, in.Changes()...)
	adm := d.Admissions()
	slack := 200 * time.Millisecond
	for _, a := range adm {
		slack = max(slack, a.Took)
	}
	timing := lease.Timing{ValidFor: c.Opts.LeaseDuration, Drift: 1e-4}
	k := Checker{Policy: "robust", Window: window, Slack: slack, History: history,
		Deployment: bound.Deployment{Regions: 3, Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: timing.Drift,
			RedisOutages: true, PolicyDelay: timing.AgentValidFor()/3 + time.Second}}
	v, err := k.Check(adm)
	if err != nil {
		t.Fatal(err)
	}
	kt := k
	kt.Policy, kt.History = "robust-tokens", []PolicyChange{{Policy: policyOf(t, tokensPolicy)}}
	vt, err := kt.Check(adm)
	if err != nil {
		t.Fatal(err)
	}
	tst := d.Stats("robust-tokens")
	t.Logf("seed %d: robust-tokens (charged after the fact): %v; %d windows judged, worst %s", seed, tst, vt.Windows, vt.Worst)
	if vt.Windows == 0 || vt.Violations > 0 {
		t.Errorf("seed %d: robust-tokens: %d windows judged, %d above their bound; worst %s", seed, vt.Windows, vt.Violations, vt.Worst)
	}
	run := robustnessRun{seed: seed, failure: failureModes[first].name, faults: in.Ran(), admitted: len(adm), modes: map[string]int64{}, verdict: v}
	for _, st := range d.Stats("robust") {
		run.sent += st.Sent
		run.errors += st.Errors
		for m, n := range st.Modes {
			run.modes[m] += n
		}
	}
	t.Logf("seed %d (%s): %d checks, %d errors, %d admitted, modes %v; %d windows judged, worst %s (slack %v)",
		seed, run.failure, run.sent, run.errors, run.admitted, run.modes, v.Windows, v.Worst, slack)
	if len(adm) == 0 || v.Windows == 0 {
		t.Fatal("nothing admitted: the run proves nothing")
	}
	if len(in.Ran()) == 0 {
		t.Fatal("no fault ran")
	}
	if v.Violations > 0 {
		t.Fatalf("seed %d: %d windows above their bound; worst %s", seed, v.Violations, v.Worst)
	}
	return run
}
