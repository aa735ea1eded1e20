package lease

import (
	"cmp"
	"container/heap"
)

// Held is the most identity demands an IdentityPlan holds for one quota:
// per agent instance and per region (over its instances). An honest agent
// reports only the identities over its part of the default share and
// those holding shares of their own (IdentityDemands, which it caps at
// Reported), so the caps are met only by a caller reporting identities
// nobody asks for; what they keep out is the coordinator's memory and the
// planning round's time, which renewals of every region wait on.
type Held struct{ Instance, Region int }

// heldRegionInstances is how many instances' full reports a region holds.
const heldRegionInstances = 4

// HeldFor is what a plan of at most max identity shares holds: an instance
// may report twice the identities that can hold shares plus one renewal's
// changes (an agent reports at most Reported, so one renewal's changes
// never meet the cap), and a region four such instances.
func HeldFor(max int) Held {
	instance := 2*max + MaxDemandChanges
	return Held{Instance: instance, Region: heldRegionInstances * instance}
}

// Reported is the most identity demands an agent instance reports for a
// quota of at most max identity shares: HeldFor's Instance less one
// renewal's changes.
func Reported(max int) int { return HeldFor(max).Instance - MaxDemandChanges }

// hottestWaiting returns the n waiting identities with the largest demand
// in any region (ties by name), in no order, without sorting them all: a
// round may have many waiting and room for few.
func (p *IdentityPlan) hottestWaiting(n int) []string {
	if n <= 0 {
		return nil
	}
	all := make([]candidate, 0, len(p.waiting))
	for id := range p.waiting {
		all = append(all, candidate{id, p.hottest(id)})
	}
	top := hottestOf(all, n)
	out := make([]string, len(top))
	for i, c := range top {
		out[i] = c.id
	}
	return out
}

// hottestDemands keeps at most n of demands: every identity in keep, then
// the largest of the others (ties by name).
func hottestDemands(demands map[string]int64, keep func(string) bool, n int) map[string]int64 {
	if len(demands) <= n {
		return demands
	}
	var rest []candidate
	out := make(map[string]int64, n)
	for id, d := range demands {
		if keep(id) {
			out[id] = d
		} else {
			rest = append(rest, candidate{id, d})
		}
	}
	for _, c := range hottestOf(rest, n-len(out)) {
		out[c.id] = c.hot
	}
	return out
}

// candidate is an identity and its demand.
type candidate struct {
	id  string
	hot int64
}

// hotter orders candidates: the larger demand first, then the smaller name.
func (c candidate) hotter(o candidate) bool {
	return cmp.Or(cmp.Compare(c.hot, o.hot), cmp.Compare(o.id, c.id)) > 0
}

// hottestOf returns the n hottest of all (all of them when fewer), in no
// order, in O(len(all) log n) on a heap of the n hottest so far, kept in
// all's first n places (all is the caller's scratch).
func hottestOf(all []candidate, n int) []candidate {
	if n <= 0 {
		return nil
	}
	if len(all) <= n {
		return all
	}
	h := coldest(all[:n])
	heap.Init(&h)
	for _, c := range all[n:] {
		if c.hotter(h[0]) {
			h[0] = c
			heap.Fix(&h, 0)
		}
	}
	return h
}

// coldest is a heap of candidates with the least hot on top.
type coldest []candidate

func (h coldest) Len() int           { return len(h) }
func (h coldest) Less(i, j int) bool { return h[j].hotter(h[i]) }
func (h coldest) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *coldest) Push(x any)        { *h = append(*h, x.(candidate)) }
func (h *coldest) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
