package lease

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// A caller flooding renewals with new identities (a region's certificate
// as any number of instances) fills at most what an instance and its
// region may hold: the rest is ignored and counted, the flooding instance
// is told to start afresh, and another region's reports and the plan's
// rounds are unaffected.
func TestIdentityPlanHoldsBoundedDemands(t *testing.T) {
	const max = 10
	p := NewIdentityPlan(max)
	held := HeldFor(max)
	defaults := map[string]int64{"us": 50, "eu": 50}
	flood := func(instance string, round int) bool {
		changes := make(map[string]int64, MaxDemandChanges)
		for i := range MaxDemandChanges {
			changes[fmt.Sprintf("fake-%s-%d-%d", instance, round, i)] = 100
		}
		return p.Update("us", instance, "n", 0, changes)
	}
	for round := range 5 {
		for i := range 2 * heldRegionInstances {
			flood(fmt.Sprint("us-", i), round)
		}
		if !p.Update("eu", "eu-1", "n", min(round, 1), map[string]int64{"eu-home": 80}) && round > 0 {
			t.Fatalf("round %d: eu's report was not kept", round)
		}
		p.Plan(100, 0, defaults)
	}
	for in, r := range p.reports {
		if len(r.demands) > held.Instance {
			t.Errorf("instance %v holds %d demands, more than %d", in, len(r.demands), held.Instance)
		}
	}
	if p.regions["us"] > held.Region {
		t.Errorf("us holds %d demands, more than %d", p.regions["us"], held.Region)
	}
	if n := countHeld(p, "us"); n != p.regions["us"] {
		t.Errorf("us's count says %d demands, its reports hold %d", p.regions["us"], n)
	}
	if p.Ignored == 0 {
		t.Error("nothing was counted as ignored")
	}
	if p.demand["eu-home"]["eu"] != 80 {
		t.Errorf("eu-home's demand in eu is %d, want 80", p.demand["eu-home"]["eu"])
	}
	if p.Len() > max {
		t.Errorf("%d identities hold shares, more than %d", p.Len(), max)
	}
	// Once the flood's instances fall silent, their demands go with them.
	for range reportRounds + 1 {
		p.Update("eu", "eu-1", "n", 1, nil)
		p.Plan(100, 0, defaults)
	}
	if p.regions["us"] != 0 || countHeld(p, "us") != 0 {
		t.Errorf("us still holds %d demands after its instances fell silent", p.regions["us"])
	}
}

// countHeld counts region's demands over its instances' reports.
func countHeld(p *IdentityPlan, region string) int {
	n := 0
	for in, r := range p.reports {
		if in.region == region {
			n += len(r.demands)
		}
	}
	return n
}

// hottestWaiting picks what sorting every waiting identity would.
func TestHottestWaitingAsASort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		p := NewIdentityPlan(0)
		for i := range r.IntN(50) {
			id := fmt.Sprint("id-", i)
			p.waiting[id] = true
			p.demand[id] = map[string]int64{"us": r.Int64N(5), "eu": r.Int64N(5)}
		}
		n := r.IntN(60)
		all := slices.Collect(maps.Keys(p.waiting))
		slices.SortFunc(all, func(a, b string) int { return cmp.Or(cmp.Compare(p.hottest(b), p.hottest(a)), cmp.Compare(a, b)) })
		want := all[:min(n, len(all))]
		got := p.hottestWaiting(n)
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d: got %v, want %v", n, got, want)
		}
	}
}

// An instance reports at most most identities: every one its grant gives
// a share, then the hottest.
func TestHottestDemandsKeepsOwnShares(t *testing.T) {
	d := map[string]int64{"a": 1, "b": 5, "c": 3, "d": 4, "own": 0}
	got := hottestDemands(d, func(id string) bool { return id == "own" }, 3)
	want := map[string]int64{"own": 0, "b": 5, "d": 4}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// An honest instance at the cap that replaces identities in one renewal
// (a removal and an addition) is kept: removals make room first, so it is
// never told to start afresh.
func TestIdentityPlanReplacesAtTheCap(t *testing.T) {
	p := NewIdentityPlan(1)
	full := make(map[string]int64, p.held.Instance)
	for i := range p.held.Instance {
		full[fmt.Sprint("id-", i)] = 10
	}
	p.Update("us", "us-1", "n", 0, full)
	for i := range 50 {
		swap := map[string]int64{fmt.Sprint("id-", i): 0, fmt.Sprint("new-", i): 10}
		if !p.Update("us", "us-1", "n", p.held.Instance, swap) {
			t.Fatalf("renewal %d: replacing an identity at the cap restarted the report", i)
		}
	}
	if p.Ignored != 0 || p.Held() != p.held.Instance {
		t.Fatalf("%d ignored, %d held; want none ignored and %d held", p.Ignored, p.Held(), p.held.Instance)
	}
}
