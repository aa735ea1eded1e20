package edge

import (
	"cmp"
	"math"
	"slices"

	"github.com/quota-lease/quota-lease/allocation"
)

// Target is an agent's part of capacity c for one policy identity at the
// edge: c split by demand between the region's direct checks (direct: the
// demand of HTTP, gRPC and Envoy RLS checks, summed over the agents), this
// agent's Envoy instances (self, instances of them) and the other agents'
// (others, when any report), all in the policy's amount unit. Demand that
// fits is met and the rest spread by the room each party's bursts need:
// requests that arrive at random need room in proportion to the square
// root of their rate, so n instances, each enforcing its own bucket of a
// part of the rate, need √n times what the direct checks, pooled in one
// bucket in Redis, need at the same rate (the other agents' count as this
// agent's: their instances are not read; a region's agents usually serve
// alike). Demand that does not fit is served in proportion
// (allocation.StrategyDemand), each party's counted at most c: no party
// can use more, so Envoy's reports (the caller's word) inflated without
// end take at most their part in proportion to c, never all of it.
func Target(c, direct, self, others int64, instances int) int64 {
	if c <= 0 || self <= 0 {
		return 0
	}
	room := math.Sqrt(float64(max(1, instances)))
	parties := []allocation.Region{
		{Name: "self", Weight: room, Demand: min(self, c)},
		{Name: "direct", Weight: 1, Demand: min(max(0, direct), c)},
	}
	if others > 0 {
		parties = append(parties, allocation.Region{Name: "others", Weight: room, Demand: min(others, c)})
	}
	out, err := allocation.Allocate(allocation.StrategyDemand, c, parties)
	if err != nil { // inputs are checked above; never for valid ones
		return 0
	}
	return out[0]
}

// Split divides amount among instances by their demand (same unit). When
// it fits, every instance gets at least an equal level and one asking
// more gets what it asks (levelled): the shares of instances asking less
// than the level do not move with the chance in their reports, and a
// change costs a message and may shrink a bucket that takes a while to
// grow back. Otherwise max-min fair (water filled: an instance asking less
// than an equal part gets what it asks), so that one instance reporting
// more than it uses, whether a slow measure or a caller inflating its
// counts, cannot push the others of the same identity toward nothing. A
// negative demand is unknown (a bucket's first report says nothing of its
// rate): it counts as the mean of the known ones, or as all of amount
// when none is known.
func Split(amount int64, demand []int64) []int64 {
	if len(demand) == 0 {
		return nil
	}
	var known, sum int64
	for _, d := range demand {
		if d >= 0 {
			known++
			sum += d
		}
	}
	guess := amount
	if known > 0 {
		guess = sum / known
	}
	rs := make([]allocation.Region, len(demand))
	var asked int64
	fits := true
	for i, d := range demand {
		if d < 0 {
			d = guess
		}
		rs[i] = allocation.Region{Weight: 1, Demand: d}
		if fits = fits && d <= amount-asked; fits { // amount-asked ≥ 0: no sum overflows
			asked += d
		}
	}
	if fits {
		return levelled(amount, rs)
	}
	out, err := allocation.Allocate(allocation.StrategyMaxMinFair, max(0, amount), rs)
	if err != nil {
		return make([]int64, len(demand))
	}
	return out
}

// Wants splits capacity c of one policy identity for one agent's slots:
// its part (Target) against the region's direct checks (direct) and the
// other agents' Envoy instances (others), then among its slots by their
// demand (Split; -1 unknown). self is the agent's edge demand: the known
// demands, and for each unknown one the mean of the known, or all of c
// when none is known.
func Wants(c, direct, others int64, demands []int64) (self int64, shares []int64) {
	var known, sum int64
	for _, d := range demands {
		if d >= 0 {
			known++
			sum += d
		}
	}
	self = sum
	if unknown := int64(len(demands)) - known; unknown > 0 {
		guess := c
		if known > 0 {
			guess = sum / known
		}
		self += unknown * guess
	}
	return self, Split(Target(c, direct, self, others, len(demands)), demands)
}

// levelled divides amount, which covers every party's demand, so that
// each gets at least an equal level L and one asking more than L gets what
// it asks: the parts sum to amount, the remainder of the level's division
// to the first parties in order.
func levelled(amount int64, parties []allocation.Region) []int64 {
	byDemand := make([]int, len(parties))
	for i := range byDemand {
		byDemand[i] = i
	}
	slices.SortStableFunc(byDemand, func(a, b int) int { return cmp.Compare(parties[b].Demand, parties[a].Demand) })
	out := make([]int64, len(parties))
	rest, n := amount, int64(len(parties))
	k := 0
	for ; k < len(byDemand) && parties[byDemand[k]].Demand > rest/n; k++ {
		i := byDemand[k]
		out[i] = parties[i].Demand // asks more than an equal part of what is left
		rest -= out[i]
		n--
	}
	level := byDemand[k:]
	slices.Sort(level)
	for j, i := range level {
		out[i] = rest / n
		if int64(j) < rest%n {
			out[i]++
		}
	}
	return out
}
