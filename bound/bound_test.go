package bound

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }

// The example of the design discussion: three independent regions each
// configured 100 req/min can admit 300 in the worst case; a static
// 34/33/33 split has a ceiling of 100 but strands a quiet region's share.
func TestDesignExample(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nalgorithm: sliding_log\nlimit: 100\nperiod: 1m\n")
	d := Deployment{Regions: 3, Instances: 1, LeaseDuration: 10 * time.Second, Shares: []float64{0.34, 0.33, 0.33}}
	ind, err := Compute(p, d, Independent, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !near(ind.WorstCase, 300) || !near(ind.Overshoot, 200) || !near(ind.Ratio, 2) {
		t.Fatalf("independent: %+v, want worst case 300", ind)
	}
	st, _ := Compute(p, d, Static, 0)
	if !near(st.WorstCase, 100) || !near(st.Stranded, 34) {
		t.Fatalf("static: %+v, want ceiling 100 and 34 stranded", st)
	}
	le, _ := Compute(p, d, Leased, 0)
	if !near(le.WorstCase, 100) || le.Stranded != 0 {
		t.Fatalf("leased, fail-closed: %+v, want 100 and nothing stranded", le)
	}
}

func TestTermsAddUp(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 50\nperiod: 1s\nburst: 100\nfailure: {mode: fail-open, open_fraction: 0.25}\n")
	d := Deployment{Regions: 4, Instances: 2, LeaseDuration: 10 * time.Second, Drift: 1e-4, RedisOutages: true, ConfigChanges: 1, QuotaDecrease: 10}
	r, err := Compute(p, d, Leased, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		TermReference:       100 + 50*2,                        // burst + rate*w
		TermDrift:           1e-4 * 100,                        // drift * rate*w
		TermDegraded:        3 * 0.25 * 200,                    // (n-1) * open fraction * reference
		TermFallback:        2 * 0.5 * (200 + 0.01 + 150 + 20), // k*phi * the Redis path's worst case
		TermBurst:           100,                               // one config change
		TermLeaseTransition: 10 * 2,                            // decrease per second over min(V, w)
	}
	var sum float64
	for k, v := range want {
		if !near(r.Terms[k], v) {
			t.Errorf("term %s = %v, want %v", k, r.Terms[k], v)
		}
		sum += v
	}
	if !near(r.WorstCase, sum) || !near(r.Overshoot, sum-200) {
		t.Errorf("worst case %v overshoot %v, want %v and %v", r.WorstCase, r.Overshoot, sum, sum-200)
	}
}

// A region-scoped policy's fallback doubles each region's own limit (one
// instance, its fallback at the full region limit), and it is counted:
// the region scope is no way around the fallback term.
func TestRegionScopeCountsFallback(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 20\nperiod: 1s\nscope: region\n")
	r, err := Compute(p, Deployment{Regions: 2, Instances: 1, RedisOutages: true}, Leased, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Terms[TermIndependent], 40) || !near(r.Terms[TermFallback], 80) || !near(r.WorstCase, 160) {
		t.Fatalf("%+v: want independent 40, fallback 80, worst case 160", r.Terms)
	}
}

// A failover that loses the last 2 s of a region's writes may admit again
// what the Redis path admitted in those 2 s: for a token bucket of 100/10s
// (burst 100) over 2 regions, the burst plus 2 s of refill, once.
func TestStoreLagTerm(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 10s\n")
	d := Deployment{Regions: 2, Instances: 1, LeaseDuration: time.Second}
	r0, _ := Compute(p, d, Leased, 0)
	d.StoreLag = 2 * time.Second
	r, err := Compute(p, d, Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Terms[TermStoreLag], 120) || !near(r.WorstCase, r0.WorstCase+120) {
		t.Fatalf("%+v: want store-lag 120 on top of %v", r.Terms, r0.WorstCase)
	}
	d.StoreLag = time.Hour // never more than one window's worth
	if r, _ := Compute(p, d, Leased, 0); !near(r.Terms[TermStoreLag], r0.WorstCase) {
		t.Fatalf("store lag beyond the window: %v, want %v", r.Terms[TermStoreLag], r0.WorstCase)
	}
	if _, err := Compute(p, Deployment{Regions: 1, Instances: 1, StoreLag: -1}, Leased, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative store lag: %v", err)
	}
}

func TestStaticShareHasNoDegradedTerm(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 90\nperiod: 1m\nfailure: {mode: static-share, static_fraction: 0.2}\n")
	r, _ := Compute(p, Deployment{Regions: 3, Instances: 1, LeaseDuration: time.Second}, Leased, 0)
	if r.Overshoot != 0 || r.Terms[TermDegraded] != 0 || !near(r.Stranded, 18) {
		t.Fatalf("%+v: want no overshoot, 18 stranded", r)
	}
}

func TestInvalidParameters(t *testing.T) {
	p := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 1\nperiod: 1s\n")
	bad := []Deployment{
		{Regions: 0, Instances: 1},
		{Regions: 1, Instances: 0},
		{Regions: 1, Instances: 1, Drift: math.NaN()},
		{Regions: 2, Instances: 1, Shares: []float64{0.7, 0.7}},
		{Regions: 2, Instances: 1, Shares: []float64{1}},
		{Regions: 1, Instances: 1, QuotaDecrease: -1},
	}
	for _, d := range bad {
		if _, err := Compute(p, d, Leased, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", d, err)
		}
	}
	if _, err := Compute(p, Deployment{Regions: 1, Instances: 1}, "magic", 0); !errors.Is(err, ErrInvalid) {
		t.Error("unknown mode accepted")
	}
}

// The transition after lowering a limit counts the previous policy's
// excess, the grants of the old total living out their lease while agents
// reload, and a fresh burst on a version bump.
func TestTransitionTerms(t *testing.T) {
	prev := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 50\nperiod: 1s\nburst: 20\n")
	next := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 20\nperiod: 1s\nburst: 20\n")
	d := Deployment{Regions: 3, Instances: 1, LeaseDuration: 2 * time.Second, PolicyDelay: time.Second}
	r, err := Transition(prev, next, true, d, Leased, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// reference 20+200; previous-limit (20+500)-(20+200); lease-transition
	// 30/s over 2+1 s; burst 20.
	want := map[string]float64{TermReference: 220, TermPreviousLimit: 300, TermLeaseTransition: 90, TermBurst: 20}
	for k, v := range want {
		if !near(r.Terms[k], v) {
			t.Errorf("term %s = %v, want %v", k, r.Terms[k], v)
		}
	}
	if !near(r.WorstCase, 630) || !near(r.Limit, 520) {
		t.Errorf("worst case %v, reference %v; want 630 and 520", r.WorstCase, r.Limit)
	}
	if got := TransitionSpan(d, 10*time.Second); got != 13*time.Second {
		t.Errorf("transition span %v, want 13s", got)
	}
	// A version bump starts every counter full: each region's when
	// independent, one burst for the static split's shares together.
	for m, want := range map[Mode]float64{Independent: 60, Static: 20, Central: 20} {
		if b, _ := Transition(prev, next, true, d, m, 10*time.Second); !near(b.Terms[TermBurst], want) {
			t.Errorf("%s after a version bump: burst term %v, want %v", m, b.Terms[TermBurst], want)
		}
	}
	// Raising a limit adds no previous-limit or lease-transition term.
	up, _ := Transition(next, prev, false, d, Leased, 10*time.Second)
	if up.Terms[TermPreviousLimit] != 0 || up.Terms[TermLeaseTransition] != 0 {
		t.Errorf("raising the limit: %v", up.Terms)
	}
}

// Shards add a named term of 0: the bound of a sharded policy lists it and
// is the bound of the same policy on one key.
func TestShardsTermIsZero(t *testing.T) {
	one := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1m\nfailure: {mode: fail-open, open_fraction: 0.1}\n")
	four := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1m\nshards: 4\nfailure: {mode: fail-open, open_fraction: 0.1}\n")
	d := Deployment{Regions: 3, Instances: 2, LeaseDuration: 10 * time.Second, Drift: 1e-4, RedisOutages: true, ConfigChanges: 1}
	r1, err1 := Compute(one, d, Leased, 0)
	r4, err4 := Compute(four, d, Leased, 0)
	if err := errors.Join(err1, err4); err != nil {
		t.Fatal(err)
	}
	if v, ok := r4.Terms[TermShards]; !ok || v != 0 {
		t.Fatalf("sharded terms %v, want a shards term of 0", r4.Terms)
	}
	if _, ok := r1.Terms[TermShards]; ok {
		t.Fatalf("one key's terms %v list shards", r1.Terms)
	}
	if !near(r4.WorstCase, r1.WorstCase) {
		t.Fatalf("sharded worst case %v, one key's %v: want the same", r4.WorstCase, r1.WorstCase)
	}
}

// A fixed window lists a window-clock term: 0 on a Redis clock that does
// not step back (the agents' estimate of it adds nothing), and one more
// window's limit per region counter when it may step back within a window;
// other algorithms list none.
func TestWindowClockTerm(t *testing.T) {
	fw := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nalgorithm: fixed_window\nlimit: 100\nperiod: 1m\n")
	region := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nalgorithm: fixed_window\nlimit: 100\nperiod: 1m\nscope: region\n")
	tb := testenv.MustPolicy(t, "name: api\nidentity: [tenant]\nlimit: 100\nperiod: 1m\n")
	d := Deployment{Regions: 3, Instances: 2, LeaseDuration: 10 * time.Second, Drift: 1e-4}
	for _, c := range []struct {
		p    *policy.Policy
		step time.Duration
		w    time.Duration
		want float64
		ok   bool
	}{
		{fw, 0, 0, 0, true},
		{fw, time.Second, 0, 100, true},               // a period's span meets 3 windows, not 2
		{fw, time.Second, 30 * time.Second, 0, true},  // half a period plus a second still meets 2
		{fw, 2 * time.Minute, time.Minute, 200, true}, // a step of two windows: two more
		{region, time.Second, 0, 300, true},           // each of the 3 regions its own limit
		{tb, time.Second, 0, 0, false},
	} {
		d.ClockStep = c.step
		r, err := Compute(c.p, d, Leased, c.w)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := r.Terms[TermWindowClock]; ok != c.ok || !near(v, c.want) {
			t.Errorf("%s, step %v, window %v: term %v (listed %v), want %v (listed %v)", c.p.Algorithm, c.step, c.w, v, ok, c.want, c.ok)
		}
	}
	d.ClockStep = -time.Second
	if _, err := Compute(fw, d, Leased, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a negative clock step: %v", err)
	}
}
