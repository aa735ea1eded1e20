package allocation

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
)

// Region is one region's input to an allocation.
type Region struct {
	Name string
	// Weight for static splits and for spreading surplus; > 0.
	Weight float64
	// Floor is the least share the region must get.
	Floor int64
	// Demand is what the region asks for, in amount units: the recent rate
	// of its hottest identity, admitted or not (see the lease protocol).
	Demand int64
}

// Strategy names an allocator.
type Strategy string

// The strategies.
const (
	StrategyStatic     Strategy = "static"
	StrategyDemand     Strategy = "demand"
	StrategyMaxMinFair Strategy = "max-min-fair"
)

// ErrFloorsExceedTotal reports floors that add up to more than the total.
var ErrFloorsExceedTotal = errors.New("quota is below the sum of the regions' floors")

// Allocate computes the ideal split of total among regions with strategy s.
// The result, in the order of regions, sums to at most total.
func Allocate(s Strategy, total int64, regions []Region) ([]int64, error) {
	if err := check(total, regions); err != nil {
		return nil, err
	}
	switch s {
	case StrategyStatic:
		return static(total, regions), nil
	case StrategyDemand:
		return demandProportional(total, regions), nil
	case StrategyMaxMinFair, "":
		return maxMinFair(total, regions), nil
	default:
		return nil, fmt.Errorf("unknown allocation strategy %q; use static, demand or max-min-fair", s)
	}
}

func check(total int64, regions []Region) error {
	if total < 0 {
		return fmt.Errorf("total %d is negative", total)
	}
	var floors int64
	for _, r := range regions {
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) {
			return fmt.Errorf("region %q: weight must be a positive finite number, got %v", r.Name, r.Weight)
		}
		if r.Floor < 0 || r.Demand < 0 {
			return fmt.Errorf("region %q: floor and demand must not be negative", r.Name)
		}
		floors += r.Floor
	}
	if floors > total {
		return fmt.Errorf("%w: floors sum to %d, total is %d", ErrFloorsExceedTotal, floors, total)
	}
	return nil
}

// static splits the total by weight, then lifts regions below their floor
// at the expense of the others (by weight).
func static(total int64, regions []Region) []int64 {
	out := floors(regions)
	rest := total - sum(out)
	w := make([]float64, len(regions))
	for i, r := range regions {
		w[i] = r.Weight
	}
	// Regions whose weighted share is above their floor share the rest.
	add := split(rest, w)
	for i := range out {
		out[i] += add[i]
	}
	return out
}

// demandProportional meets all demand when it fits and spreads the surplus
// by weight; otherwise it gives floors and splits the rest in proportion to
// demand above the floor.
func demandProportional(total int64, regions []Region) []int64 {
	if out, ok := fits(total, regions); ok {
		return out
	}
	out := floors(regions)
	w := make([]float64, len(regions))
	for i, r := range regions {
		w[i] = float64(max(0, r.Demand-r.Floor))
	}
	add := split(total-sum(out), w)
	for i := range out {
		out[i] += add[i]
	}
	return out
}

// maxMinFair gives floors, then water-fills the demand above the floors:
// no region can get more without taking from one that has less.
func maxMinFair(total int64, regions []Region) []int64 {
	if out, ok := fits(total, regions); ok {
		return out
	}
	out := floors(regions)
	rest := total - sum(out)
	want := make([]int64, len(regions))
	idx := make([]int, len(regions))
	for i, r := range regions {
		want[i] = max(0, r.Demand-r.Floor)
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(want[a], want[b]) })
	for k, i := range idx {
		n := int64(len(idx) - k)
		level := rest / n
		if want[i] <= level {
			out[i] += want[i]
			rest -= want[i]
			continue
		}
		// Everyone left wants more than the level: split evenly, the
		// remainder to the first in region order.
		left := idx[k:]
		sort.Ints(left)
		for j, i := range left {
			extra := int64(0)
			if int64(j) < rest%n {
				extra = 1
			}
			out[i] += level + extra
		}
		break
	}
	return out
}

// fits returns max(demand, floor) for every region plus the surplus spread
// by weight, when that fits in total.
func fits(total int64, regions []Region) ([]int64, bool) {
	out := make([]int64, len(regions))
	w := make([]float64, len(regions))
	for i, r := range regions {
		out[i] = max(r.Demand, r.Floor)
		w[i] = r.Weight
	}
	s := sum(out)
	if s > total {
		return nil, false
	}
	add := split(total-s, w)
	for i := range out {
		out[i] += add[i]
	}
	return out, true
}

func floors(regions []Region) []int64 {
	out := make([]int64, len(regions))
	for i, r := range regions {
		out[i] = r.Floor
	}
	return out
}

func sum(v []int64) int64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return s
}

// split divides amount in proportion to w by largest remainder: the parts
// sum to exactly amount (or 0 when all weights are 0), ties to the lower
// index, so the result is deterministic.
func split(amount int64, w []float64) []int64 {
	out := make([]int64, len(w))
	var tw float64
	for _, x := range w {
		tw += x
	}
	if amount <= 0 || tw <= 0 {
		return out
	}
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(w))
	var given int64
	for i, x := range w {
		exact := float64(amount) * x / tw
		out[i] = int64(math.Floor(exact))
		given += out[i]
		rems[i] = rem{i, exact - float64(out[i])}
	}
	// Float rounding can put given a little above amount; take it back.
	for i := len(out) - 1; given > amount && i >= 0; i-- {
		if out[i] > 0 {
			out[i]--
			given--
		}
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for k := 0; given < amount; k = (k + 1) % len(rems) {
		if w[rems[k].i] > 0 {
			out[rems[k].i]++
			given++
		}
	}
	return out
}
