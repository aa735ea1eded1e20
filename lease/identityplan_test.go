package lease

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// An identity gets shares of its own when its demand in a region, summed
// over the region's instances, is above that region's default; its limit
// is split by its own demand; at most max identities hold shares (the rest
// are counted as unfit); idle ones and silent instances are forgotten.
func TestIdentityPlan(t *testing.T) {
	defaults := map[string]int64{"us": 40, "eu": 30, "ap": 30}
	p := NewIdentityPlan(2)
	reports := map[string]*DemandReport{}
	report := func(region, instance string, demands map[string]int64) {
		r := reports[instance]
		if r == nil {
			r = &DemandReport{}
			reports[instance] = r
		}
		changes := r.Changes(demands, 100, MaxDemandChanges)
		r.Answered(changes, p.Update(region, instance, "n", r.Len(), changes))
	}
	report("us", "us-1", map[string]int64{"x": 25, "y": 10})
	report("us", "us-2", map[string]int64{"x": 25})
	report("eu", "eu-1", map[string]int64{"y": 35, "z": 31})
	report("ap", "ap-1", map[string]int64{"w": 60})
	p.Plan(100, 0, defaults)
	// x asks 50 in us (two instances), w 60 in ap, y 35 in eu, z 31 in eu:
	// the two hottest fit.
	if p.Len() != 2 || p.Unfit != 2 {
		t.Fatalf("%d planned, %d unfit; want 2 and 2", p.Len(), p.Unfit)
	}
	us, eu, ap := p.Targets("us"), p.Targets("eu"), p.Targets("ap")
	if x := us["x"]; x < 50 || x+eu["x"]+ap["x"] > 100 {
		t.Fatalf("x's targets: us %d, eu %d, ap %d; want at least its demand (50) in us and no more than its limit in all", x, eu["x"], ap["x"])
	}
	if w := ap["w"]; w < 60 || w+us["w"]+eu["w"] > 100 {
		t.Fatalf("w's targets: ap %d, us %d, eu %d", w, us["w"], eu["w"])
	}
	if _, ok := us["y"]; ok {
		t.Fatal("y holds a share although it did not fit")
	}
	// An instance that stops renewing is forgotten: x's demand in us is
	// then us-2's alone.
	for i := 0; i < reportRounds; i++ {
		report("us", "us-2", map[string]int64{"x": 25})
		report("ap", "ap-1", map[string]int64{"w": 60})
		p.Plan(100, 0, defaults)
	}
	if p.demand["x"]["us"] != 25 {
		t.Fatalf("x's demand in us after us-1 went silent: %d, want 25", p.demand["x"]["us"])
	}
	// An identity with no demand anywhere goes back to the default.
	for i := 0; i < identityIdleRounds; i++ {
		report("us", "us-2", map[string]int64{"x": 0})
		report("ap", "ap-1", map[string]int64{"w": 60})
		p.Plan(100, 0, defaults)
	}
	if _, ok := p.Targets("us")["x"]; ok {
		t.Fatal("idle x still holds shares of its own")
	}
	if p.Targets("ap")["w"] < 60 {
		t.Fatal("busy w lost its shares")
	}
}

// An identity asking for more than its limit gets none of it in a region
// that asks for a trickle (its bucket would sit full), and keeps its split
// while every region still asks for what it gives (noise in the demand
// moves no share).
func TestIdentityPlanSplitsWhereItIsUsed(t *testing.T) {
	defaults := map[string]int64{"us": 10, "eu": 10, "ap": 10}
	p := NewIdentityPlan(10)
	p.Update("us", "us", "n", 0, map[string]int64{"x": 150})
	p.Update("eu", "eu", "n", 0, map[string]int64{"x": 60})
	p.Update("ap", "ap", "n", 0, map[string]int64{"x": 4})
	p.Plan(100, 5, defaults)
	us, eu, ap := p.Targets("us")["x"], p.Targets("eu")["x"], p.Targets("ap")["x"]
	if ap != 0 || us+eu != 100 || us < eu {
		t.Fatalf("x split us %d, eu %d, ap %d; want none in ap (4 < 3 useful shares of 5) and all 100 in us and eu by demand", us, eu, ap)
	}
	p.Update("us", "us", "n", 1, map[string]int64{"x": 130})
	p.Update("eu", "eu", "n", 1, map[string]int64{"x": 75})
	p.Plan(100, 5, defaults)
	if p.Targets("us")["x"] != us || p.Targets("eu")["x"] != eu {
		t.Fatalf("a split every region still uses moved: us %d -> %d, eu %d -> %d", us, p.Targets("us")["x"], eu, p.Targets("eu")["x"])
	}
	p.Update("us", "us", "n", 1, map[string]int64{"x": 20})
	p.Plan(100, 5, defaults)
	if got := p.Targets("us")["x"]; got >= us {
		t.Fatalf("us asks for 20 and keeps %d", got)
	}
}

// A split planned while one region's demand was still being measured is
// held once both ask for more than the limit, as long as each keeps half
// its part; served at the edge (SetEdge), where a region's share is split
// again into Envoy instances' buckets, only while each keeps three
// quarters, so a 29/71 split of equal demand is planned again (damped
// toward 50/50).
func TestIdentityPlanEvenAtTheEdge(t *testing.T) {
	defaults := map[string]int64{"us": 10, "eu": 10}
	for _, edge := range []bool{false, true} {
		p := NewIdentityPlan(10)
		p.SetEdge(edge)
		p.Update("us", "us", "n", 0, map[string]int64{"x": 40})
		p.Update("eu", "eu", "n", 0, map[string]int64{"x": 100})
		p.Plan(100, 0, defaults)
		if us := p.Targets("us")["x"]; us != 29 {
			t.Fatalf("x split while us measured 40 of 140: us %d, want 29", us)
		}
		p.Update("us", "us", "n", 1, map[string]int64{"x": 100})
		p.Plan(100, 0, defaults)
		us := p.Targets("us")["x"]
		if edge && us != 50 || !edge && us != 29 {
			t.Fatalf("edge %v: x split at equal demand: us %d, want %d", edge, us, map[bool]int64{false: 29, true: 50}[edge])
		}
	}
}

// Whatever demands do (appear, move, vanish, in the same round as the
// defaults change), and whatever the regions and the most shares are, a
// round leaves the plan consistent: waiting holds exactly the unplanned
// identities over a default, quiet exactly the planned ones within them
// all, each region's targets are the planned identities' splits, and no
// split gives more than the total. Identities without demand go back to
// the default within the idle rounds.
func TestIdentityPlanInvariants(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		p := NewIdentityPlan(1 + r.IntN(6))
		const total = 1000
		all := []string{"us", "eu", "ap"}
		report := map[string]*DemandReport{}
		for round := 0; round < 80; round++ {
			regions := all[:1+r.IntN(3)]
			defaults := map[string]int64{}
			for _, rg := range regions {
				defaults[rg] = int64(r.IntN(400))
			}
			if r.IntN(10) == 0 {
				p.SetMax(r.IntN(6))
			}
			for _, rg := range all {
				now := map[string]int64{}
				if round < 50 { // then every demand is gone
					for k := 0; k < r.IntN(5); k++ {
						now[fmt.Sprint("id", r.IntN(8))] = int64(r.IntN(1200))
					}
				}
				if report[rg] == nil {
					report[rg] = &DemandReport{}
				}
				changes := report[rg].Changes(now, total, MaxDemandChanges)
				report[rg].Answered(changes, p.Update(rg, rg+"-1", "n", report[rg].Len(), changes))
			}
			p.Plan(total, 1, defaults)
			for id := range p.waiting {
				if _, planned := p.targets[id]; planned || !p.over(id, defaults) {
					t.Fatalf("seed %d round %d: %s waits, planned %v, over %v", seed, round, id, planned, p.over(id, defaults))
				}
			}
			for id := range p.demand {
				if _, planned := p.targets[id]; !planned && p.over(id, defaults) && !p.waiting[id] {
					t.Fatalf("seed %d round %d: %s is over and unplanned but not waiting", seed, round, id)
				}
			}
			for id, split := range p.targets {
				_, quiet := p.quiet[id]
				if quiet == p.over(id, defaults) {
					t.Fatalf("seed %d round %d: %s quiet %v, over %v", seed, round, id, quiet, p.over(id, defaults))
				}
				var sum int64
				for _, rg := range regions {
					if got := p.Targets(rg)[id]; got != split[rg] {
						t.Fatalf("seed %d round %d: %s's target in %s is %d, its split %d", seed, round, id, rg, got, split[rg])
					}
					sum += split[rg]
				}
				if sum > total {
					t.Fatalf("seed %d round %d: %s's split %v sums to %d > %d", seed, round, id, split, sum, total)
				}
			}
		}
		if p.Len() != 0 {
			t.Fatalf("seed %d: %d identities still hold shares 30 rounds after every demand went", seed, p.Len())
		}
	}
}

// A restarted agent process (a new nonce under the same instance) that
// has measured nothing yet keeps its predecessor's demands, so the
// identity's split between the regions holds across the restart; its own
// first report replaces them, and a process that never reports lets them
// age out.
func TestIdentityPlanRestartKeepsDemand(t *testing.T) {
	defaults := map[string]int64{"us": 10, "eu": 10}
	p := NewIdentityPlan(10)
	p.Update("us", "us-1", "old", 0, map[string]int64{"x": 150})
	p.Update("eu", "eu-1", "n", 0, map[string]int64{"x": 150})
	p.Plan(100, 5, defaults)
	us := p.Targets("us")["x"]
	if us < 40 {
		t.Fatalf("us holds %d of x, want about half", us)
	}
	if p.Update("us", "us-1", "new", 0, nil) {
		t.Fatal("a new process's empty report was taken as known: it must count nothing as held")
	}
	p.Plan(100, 5, defaults)
	if got := p.Targets("us")["x"]; got != us {
		t.Fatalf("us's share of x moved %d -> %d while its restarted process measured", us, got)
	}
	// Its first report stands alone: 20, not 150 + 20.
	p.Update("us", "us-1", "new", 0, map[string]int64{"x": 20})
	for range 3 {
		p.Plan(100, 5, defaults)
	}
	if got := p.Targets("us")["x"]; got >= us {
		t.Fatalf("us reports 20 and keeps %d", got)
	}
	// A process that never reports: the predecessor's demands age out.
	q := NewIdentityPlan(10)
	q.Update("us", "us-1", "old", 0, map[string]int64{"x": 150})
	q.Update("eu", "eu-1", "n", 0, map[string]int64{"x": 150})
	for range reportRounds + 2 {
		q.Update("us", "us-1", "new", 0, nil)
		q.Update("eu", "eu-1", "n", 1, nil)
		q.Plan(100, 5, defaults)
	}
	if got := q.Targets("us")["x"]; got != 0 {
		t.Fatalf("a restarted process that never reports still holds %d of x for its predecessor", got)
	}
}
