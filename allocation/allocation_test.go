package allocation

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func randomRegions(r *rand.Rand, total int64) []Region {
	n := r.IntN(5) + 1
	out := make([]Region, n)
	var floors int64
	for i := range out {
		out[i] = Region{Name: fmt.Sprint("r", i), Weight: float64(r.IntN(9) + 1), Demand: r.Int64N(total + 1)}
		if r.IntN(3) == 0 {
			out[i].Demand = 0
		}
		if f := r.Int64N(total/int64(n) + 1); floors+f <= total && r.IntN(2) == 0 {
			out[i].Floor = f
			floors += f
		}
	}
	return out
}

// Properties of every strategy over many random inputs: the sum never
// exceeds the total (and equals it: nothing stranded), no region gets less
// than its floor, and demand that fits is met.
func TestAllocateProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for iter := 0; iter < 20000; iter++ {
		total := r.Int64N(1_000_000) + 1
		if iter%100 == 0 {
			total = r.Int64N(10) // tiny totals stress the rounding
		}
		regions := randomRegions(r, total)
		var demand int64
		for _, rg := range regions {
			demand += max(rg.Demand, rg.Floor)
		}
		for _, s := range []Strategy{StrategyStatic, StrategyDemand, StrategyMaxMinFair} {
			out, err := Allocate(s, total, regions)
			if err != nil {
				t.Fatalf("%s %d %+v: %v", s, total, regions, err)
			}
			if got := sum(out); got != total {
				t.Fatalf("%s: shares %v sum to %d, total %d", s, out, got, total)
			}
			for i, rg := range regions {
				if out[i] < rg.Floor {
					t.Fatalf("%s: region %s got %d below floor %d", s, rg.Name, out[i], rg.Floor)
				}
				if s != StrategyStatic && demand <= total && out[i] < rg.Demand {
					t.Fatalf("%s: demand fits (%d <= %d) but %s got %d of %d", s, demand, total, rg.Name, out[i], rg.Demand)
				}
			}
		}
	}
}

// Max-min fairness: when demand exceeds the total, a region that gets less
// than it asked for gets at least as much (above floor) as any other.
func TestMaxMinFairIsFair(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	for iter := 0; iter < 5000; iter++ {
		total := r.Int64N(100_000) + 1
		regions := randomRegions(r, total)
		for i := range regions {
			regions[i].Floor = 0
		}
		out, _ := Allocate(StrategyMaxMinFair, total, regions)
		var demand int64
		for _, rg := range regions {
			demand += rg.Demand
		}
		if demand <= total {
			continue
		}
		for i, a := range regions {
			if out[i] >= a.Demand {
				continue
			}
			for j := range regions {
				if out[j] > out[i]+1 {
					t.Fatalf("unfair: %s starved at %d (wants %d) while %s has %d: %v %+v", a.Name, out[i], a.Demand, regions[j].Name, out[j], out, regions)
				}
			}
		}
	}
}

func TestAllocateExamples(t *testing.T) {
	regions := []Region{{Name: "us", Weight: 1, Demand: 80}, {Name: "eu", Weight: 1, Demand: 10}, {Name: "ap", Weight: 1, Demand: 10}}
	out, _ := Allocate(StrategyStatic, 100, regions)
	if fmt.Sprint(out) != "[34 33 33]" {
		t.Errorf("static 1:1:1 of 100 = %v, want [34 33 33]", out)
	}
	out, _ = Allocate(StrategyMaxMinFair, 100, regions)
	if fmt.Sprint(out) != "[80 10 10]" {
		t.Errorf("max-min of demand 80/10/10 = %v", out)
	}
	regions[1].Demand, regions[2].Demand = 60, 5
	out, _ = Allocate(StrategyMaxMinFair, 100, regions)
	if fmt.Sprint(out) != "[48 47 5]" {
		t.Errorf("max-min of demand 80/60/5 = %v, want [48 47 5]", out)
	}
	out, _ = Allocate(StrategyDemand, 100, regions)
	if sum(out) != 100 || out[2] < 3 || out[0] < out[1] {
		t.Errorf("demand-proportional of 80/60/5 = %v", out)
	}
}

func TestAllocateBadInput(t *testing.T) {
	cases := []struct {
		total   int64
		regions []Region
		want    string
	}{
		{100, []Region{{Name: "a", Weight: 1, Floor: 60}, {Name: "b", Weight: 1, Floor: 50}}, "below the sum of the regions' floors"},
		{100, []Region{{Name: "a", Weight: 0}}, "weight"},
		{100, []Region{{Name: "a", Weight: 1, Demand: -1}}, "negative"},
		{-1, nil, "negative"},
	}
	for _, c := range cases {
		if _, err := Allocate(StrategyStatic, c.total, c.regions); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
	}
	_, err := Allocate(StrategyStatic, 10, []Region{{Name: "a", Weight: 1, Floor: 11}})
	if !errors.Is(err, ErrFloorsExceedTotal) {
		t.Errorf("floors error does not wrap ErrFloorsExceedTotal: %v", err)
	}
	if _, err := Allocate("round-robin", 10, nil); err == nil {
		t.Error("unknown strategy accepted")
	}
}

// Damping: steps are bounded, small changes ignored, the sum stays within
// the total, floors are held, and repeated rounds converge on the ideal.
func TestDampProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 1))
	for iter := 0; iter < 20000; iter++ {
		total := r.Int64N(1_000_000) + 1
		regions := randomRegions(r, total)
		ideal, _ := Allocate(StrategyMaxMinFair, total, regions)
		prev, _ := Allocate(StrategyStatic, total, regions)
		fl := floors(regions)
		d := Damping{MaxStep: total/10 + 1, Hysteresis: r.Int64N(total/100 + 1)}
		cur := prev
		for round := 0; round < 40; round++ {
			next := Damp(cur, ideal, fl, total, d)
			if sum(next) > total {
				t.Fatalf("round %d: %v sums over %d", round, next, total)
			}
			for i := range next {
				if abs(next[i]-cur[i]) > d.MaxStep {
					t.Fatalf("step %d > max %d", next[i]-cur[i], d.MaxStep)
				}
				if next[i] < fl[i] {
					t.Fatalf("below floor: %d < %d", next[i], fl[i])
				}
			}
			cur = next
		}
		for i := range cur {
			if abs(cur[i]-ideal[i]) > d.Hysteresis+int64(len(cur)) {
				t.Fatalf("did not converge: %v vs ideal %v (hysteresis %d)", cur, ideal, d.Hysteresis)
			}
		}
	}
}
