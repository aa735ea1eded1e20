package cluster

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

var bins Binaries

// Every test here starts real processes: under -short they skip, and the
// binaries are not even built.
func TestMain(m *testing.M) {
	os.Exit(testenv.ShortMain(m, func() (remove func(), err error) {
		bins, remove, err = BuildTemp()
		return remove, err
	}))
}

const globalPolicy = `
name: api-global
identity: [api]
limit: 60
period: 1s
burst: 60
failure: {mode: static-share, static_fraction: 0.1}
`

const tenantPolicy = `
name: per-tenant
identity: [tenant]
limit: 10
period: 1s
burst: 30
failure: {mode: static-share, static_fraction: 0.05}
`

// window is the length the admitted totals are checked over; slack widens
// the bound's window for the gap between a client's send time and the
// agent's decision time.
const window, slack = 5 * time.Second, 200 * time.Millisecond

func start(t *testing.T, policies string) *Cluster {
	t.Helper()
	return startWith(t, policies, Options{})
}

func startWith(t *testing.T, policies string, o Options) *Cluster {
	t.Helper()
	return startIn(t, t.TempDir(), policies, o)
}

// startIn is startWith in dir, for a test whose processes' flags name the
// cluster's files before it starts.
func startIn(t *testing.T, dir, policies string, o Options) *Cluster {
	t.Helper()
	c, err := Start(t.Context(), bins, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for _, f := range []string{"coordinator-1", "coordinator-2", "agent-us", "agent-eu", "agent-ap"} {
				b, _ := os.ReadFile(dir + "/" + f + ".log")
				lines := strings.Split(string(b), "\n")
				t.Logf("--- %s (last lines)\n%s", f, strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
		}
	})
	if err := c.SetPolicies(t.Context(), policies); err != nil {
		t.Fatal(err)
	}
	return c
}

func policyOf(t *testing.T, yaml string) *policy.Policy {
	ps, err := policy.ParsePolicies([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

// checkBound asserts that no identity was admitted more in any window
// than the bound the coordinator publishes for this deployment (Redis
// outages counted), nor, in windows no check decided on an agent's local
// fallback came near, more than the bound for dep without them
// (checkWindows): a loaded machine's Redis may answer a check later than
// the check timeout, which an agent takes as an outage.
func checkBound(t *testing.T, d *Driver, p *policy.Policy, dep bound.Deployment) {
	t.Helper()
	dep.Regions, dep.Instances, dep.LeaseDuration, dep.Drift = 3, 1, 2*time.Second, 1e-4
	dep.RedisOutages = true
	checkWindows(t, d.Admissions(), p, dep, window, slack)
}

// checkWindows judges every window of length w ending at an admission
// of p (per identity, by the clients' times): at most the bound over
// w+slack with dep, and, where no direct check of the identity was
// admitted by an agent's local fallback within slack of the window, at
// most the bound without Redis outages.
func checkWindows(t *testing.T, adm []Admission, p *policy.Policy, dep bound.Deployment, w, slack time.Duration) {
	t.Helper()
	loose, err := bound.Compute(p, dep, bound.Leased, w+slack)
	if err != nil {
		t.Fatal(err)
	}
	tightDep := dep
	tightDep.RedisOutages = false
	tight, err := bound.Compute(p, tightDep, bound.Leased, w+slack)
	if err != nil {
		t.Fatal(err)
	}
	fallback := map[string][]time.Time{}
	for _, a := range adm {
		if a.Policy == p.Name && a.Mode == "local-fallback" {
			fallback[a.Identity] = append(fallback[a.Identity], a.At)
		}
	}
	for _, ts := range fallback {
		slices.SortFunc(ts, time.Time.Compare)
	}
	var windows, overLoose, overTight, judgedTight int
	var worst WindowCount
	forEachWindow(adm, p.Name, w, func(id string, end time.Time, n int) error {
		windows++
		b := tight
		ts := fallback[id]
		if i, _ := slices.BinarySearchFunc(ts, end.Add(-w-slack), time.Time.Compare); i < len(ts) && !ts[i].After(end.Add(slack)) {
			b = loose
		} else {
			judgedTight++
			if float64(n) > tight.WorstCase {
				overTight++
			}
		}
		if float64(n) > loose.WorstCase {
			overLoose++
		}
		if wc := (WindowCount{Identity: id, End: end, Count: n, Bound: b.WorstCase, Terms: b.Terms}); wc.Ratio() > worst.Ratio() {
			worst = wc
		}
		return nil
	})
	t.Logf("%s, %s windows (+%s slack): %d judged, %d of them without fallback admissions; bound %.1f (%.1f without Redis outages); worst %.2f of its bound: %s; by region and mode %v",
		p.Name, w, slack.Round(time.Millisecond), windows, judgedTight, loose.WorstCase, tight.WorstCase, worst.Ratio(), worst, composition(adm, p.Name, worst.Identity, worst.End, w))
	if overLoose > 0 || overTight > 0 {
		t.Errorf("%s, %s windows: %d over the published bound %.1f, %d over the bound without Redis outages %.1f; worst: %s",
			p.Name, w, overLoose, loose.WorstCase, overTight, tight.WorstCase, worst)
	}
	if windows == 0 {
		t.Errorf("%s: nothing admitted", p.Name)
	}
}

// steady is a load of rate requests/s per region with the given weights.
func steady(policy, attr string, ids int, hot float64, rates map[string]float64) Load {
	return Load{Policy: policy, Attribute: attr, Identities: ids, Hot: hot,
		Rate: func(region string, _ time.Duration) float64 { return rates[region] }}
}

// checkGlobal asserts what every run of api-global alone must show: no
// identity admitted more in a window than the bound for dep allows, and no
// check failed.
func checkGlobal(t *testing.T, d *Driver, dep bound.Deployment) {
	t.Helper()
	checkBound(t, d, policyOf(t, globalPolicy), dep)
	noErrors(t, d, "api-global")
}

// decidedIn asserts that region decided some of policy's checks in mode,
// where a run's fault must have taken it; what says what it missed.
func decidedIn(t *testing.T, d *Driver, policy, region, mode, what string) {
	t.Helper()
	if st := d.Stats(policy)[region]; st.Modes[mode] == 0 {
		t.Fatalf("%s: %s", what, st.Describe())
	}
}

// runWhile drives loads through c for dur in the background while script
// runs in the test's goroutine (the test's faults, timed by sleeps from the
// load's start), and returns the driver once both are done. A script that
// fails the test ends it at once; the load then stops with the test.
func runWhile(t *testing.T, c *Cluster, dur time.Duration, script func(), loads ...Load) *Driver {
	t.Helper()
	d := NewDriver(c)
	done := make(chan struct{})
	go func() { d.Run(t.Context(), dur, loads...); close(done) }()
	script()
	<-done
	return d
}

// runRegionFault starts a cluster serving globalPolicy and drives a steady
// load of it at rates (requests a second by region) for dur, with fault on
// for region's agent between from and to after the load's start: the run
// of each test of one region's fault. It returns the driver.
func runRegionFault(t *testing.T, rates map[string]float64, dur time.Duration, region string, from, to time.Duration,
	fault func(a *AgentProcess, on bool)) *Driver {
	t.Helper()
	c := start(t, globalPolicy)
	a := c.RegionAgents(region)[0]
	return runWhile(t, c, dur, func() {
		time.Sleep(from)
		fault(a, true)
		time.Sleep(to - from)
		fault(a, false)
	}, steady("api-global", "api", 1, 0, rates))
}

func noErrors(t *testing.T, d *Driver, policy string) {
	for region, st := range d.Stats(policy) {
		t.Logf("%s in %s: %s", policy, region, st.Describe())
		if st.Errors > 0 {
			t.Errorf("%s in %s: %d checks failed (%s)", policy, region, st.Errors, st.Describe())
		}
	}
}

// The coordinator leader is killed (SIGKILL) while regions renew and
// shares move; the follower takes over and no window exceeds the bound.
func TestE2ELeaderKilled(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	leader := c.Leader(ctx)
	if leader == nil {
		t.Fatal("no leader")
	}
	load := Load{Policy: "api-global", Attribute: "api", Identities: 1,
		Rate: func(region string, el time.Duration) float64 {
			if el < 5*time.Second {
				return map[string]float64{"us": 50, "eu": 20, "ap": 10}[region]
			}
			return map[string]float64{"us": 10, "eu": 50, "ap": 20}[region]
		}}
	d := runWhile(t, c, 14*time.Second, func() {
		time.Sleep(6 * time.Second)
		leader.Kill()
		next, err := c.WaitLeader(ctx, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next == leader {
			t.Fatal("the killed replica still leads")
		}
	}, load)
	checkGlobal(t, d, bound.Deployment{})
	leases, err := c.Leases(ctx)
	if err != nil || len(leases) == 0 {
		t.Fatalf("new leader lists no leases: %v %v", leases, err)
	}
}

// One region is cut off from the coordinator by a fault proxy: it falls
// back to its degraded budget at expiry, the totals stay within the bound,
// and it re-leases when the partition heals.
func TestE2EPartition(t *testing.T) {
	testenv.SkipMultiProcess(t)
	d := runRegionFault(t, map[string]float64{"us": 40, "eu": 30, "ap": 30}, 16*time.Second,
		"ap", 4*time.Second, 11*time.Second, (*AgentProcess).Partition)
	checkGlobal(t, d, bound.Deployment{})
	decidedIn(t, d, "api-global", "ap", "degraded", "ap never decided on its degraded budget")
	decidedIn(t, d, "api-global", "ap", "leased", "ap never leased")
}

// Redis in one region gets slower than the check timeout: that agent
// answers from its local fallback, within the timeout, and the totals
// stay within the bound (which counts the fallback).
func TestE2ERedisSlow(t *testing.T) {
	testenv.SkipMultiProcess(t)
	slow := func(eu *AgentProcess, on bool) {
		if !on {
			eu.ToRedis.Restore()
			return
		}
		eu.ToRedis.SetDelay(100 * time.Millisecond)
	}
	d := runRegionFault(t, map[string]float64{"us": 30, "eu": 40, "ap": 20}, 12*time.Second,
		"eu", 3*time.Second, 8*time.Second, slow)
	checkGlobal(t, d, bound.Deployment{RedisOutages: true})
	decidedIn(t, d, "api-global", "eu", "local-fallback", "eu never used its fallback")
}

// The quota is lowered while keys are active; the bound counts the grants
// at the old total that still run out their lease.
func TestE2EQuotaChange(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	d := runWhile(t, c, 12*time.Second, func() {
		time.Sleep(5 * time.Second)
		if err := c.SetPolicies(t.Context(), strings.Replace(globalPolicy, "limit: 60", "limit: 30", 1)); err != nil {
			t.Fatal(err)
		}
	}, steady("api-global", "api", 1, 0, map[string]float64{"us": 40, "eu": 30, "ap": 30}))
	checkGlobal(t, d, bound.Deployment{QuotaDecrease: 30})
}

// One hot tenant among many, sending from every region, under a
// per-tenant limit; alongside the global policy.
func TestE2EHotTenant(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy+"---\n"+tenantPolicy)
	ctx := t.Context()
	d := NewDriver(c)
	d.Run(ctx, 10*time.Second,
		steady("per-tenant", "tenant", 50, 0.5, map[string]float64{"us": 20, "eu": 12, "ap": 8}),
		steady("api-global", "api", 1, 0, map[string]float64{"us": 20, "eu": 20, "ap": 20}))
	checkBound(t, d, policyOf(t, tenantPolicy), bound.Deployment{})
	checkBound(t, d, policyOf(t, globalPolicy), bound.Deployment{})
	noErrors(t, d, "per-tenant")
}

// Traffic moves between regions every two seconds.
func TestE2EFastShift(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	regions := []string{"us", "eu", "ap"}
	load := Load{Policy: "api-global", Attribute: "api", Identities: 1,
		Rate: func(region string, el time.Duration) float64 {
			if regions[int(el/(2*time.Second))%3] == region {
				return 80
			}
			return 5
		}}
	d := NewDriver(c)
	d.Run(ctx, 12*time.Second, load)
	checkGlobal(t, d, bound.Deployment{})
}

// The demo, shortened: it runs its whole script and reports every policy
// within the bound.
func TestDemoShort(t *testing.T) {
	testenv.SkipMultiProcess(t)
	var out strings.Builder
	if err := RunDemo(t.Context(), bins, t.TempDir(), 16*time.Second, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"killed coordinator-", "cutting ap off", "policy api-global", "policy per-tenant", "| api-global admitted so far",
		"each progress line:", "checks decided in that mode", "(burst 60 + 60/s x 5s)",
		"policy edge-tenant", "| eu's Envoys admitted", "eu's Envoys", "us's services", "the bound's edge term 0"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, "within the bound") != 3 || strings.Contains(s, "OVER") {
		t.Fatalf("demo verdicts:\n%s", s)
	}
	// The edge decided, and admitted some: the last progress line's count.
	m := regexp.MustCompile(`eu's Envoys admitted (\d+) of (\d+)`).FindAllStringSubmatch(s, -1)
	if len(m) == 0 || m[len(m)-1][1] == "0" {
		t.Fatalf("eu's Envoys admitted nothing:\n%s", s)
	}
	// So did the services: their row's admitted column.
	if m := regexp.MustCompile(`us's services\s+\d+\s+(\d+)`).FindStringSubmatch(s); m == nil || m[1] == "0" {
		t.Fatalf("us's services admitted nothing:\n%s", s)
	}
}

// Tenants with a home get their whole limit where they live (identity
// shares): tenant a sends only to us and tenant b only to eu, each 15/s
// against a per-tenant limit of 10/s; tenant m sends from us, then moves
// to eu. Counted from the client's records over ten seconds: each gets at
// least 90% of its limit once its shares have moved (a and b from 10 s
// after the start, m from 10 s after its move to 20 s after it), and no
// identity's window exceeds the bound.
func TestE2EHomedTenants(t *testing.T) {
	testenv.SkipMultiProcess(t)
	const homed = `name: per-tenant
identity: [tenant]
limit: 10
period: 1s
burst: 10
failure: {mode: static-share, static_fraction: 0.2}
`
	c := start(t, homed)
	const move, dur = 20 * time.Second, 40 * time.Second
	homes := map[string]string{"us": "a", "eu": "b"}
	tenants := Load{Policy: "per-tenant", Attribute: "tenant",
		Rate: func(region string, _ time.Duration) float64 {
			if homes[region] != "" {
				return 15
			}
			return 0
		},
		Identity: func(region string, _ time.Duration) string { return homes[region] }}
	mover := Load{Policy: "per-tenant", Attribute: "tenant",
		Rate: func(region string, el time.Duration) float64 {
			if (el < move && region == "us") || (el >= move && region == "eu") {
				return 15
			}
			return 0
		},
		Identity: func(string, time.Duration) string { return "m" }}
	d := NewDriver(c)
	start := time.Now()
	d.Run(t.Context(), dur, tenants, mover)
	admitted := func(identity string, from, to time.Duration) int {
		n := 0
		for _, a := range d.Admissions() {
			if el := a.At.Sub(start); a.Identity == identity && el >= from && el < to {
				n++
			}
		}
		return n
	}
	for _, c := range []struct {
		identity string
		from, to time.Duration
	}{{"a", 10 * time.Second, move}, {"b", 10 * time.Second, move}, {"a", move + 10*time.Second, dur}, {"m", move + 10*time.Second, dur}} {
		got, want := admitted(c.identity, c.from, c.to), int(0.9*10*(c.to-c.from).Seconds())
		t.Logf("tenant %s: %d admitted in [%v, %v), want at least %d", c.identity, got, c.from, c.to, want)
		if got < want {
			t.Errorf("tenant %s: %d admitted in [%v, %v), want at least %d (90%% of its 10/s); its region's third would give %d",
				c.identity, got, c.from, c.to, want, want/3)
		}
	}
	checkBound(t, d, policyOf(t, homed), bound.Deployment{})
	noErrors(t, d, "per-tenant")
}
