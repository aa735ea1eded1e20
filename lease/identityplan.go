package lease

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/quota-lease/quota-lease/allocation"
)

// identityHysteresis: an identity's target in a region moves only by more
// than 1/identityHysteresis of the total, so noise in its demand does not
// make every renewal a new grant.
const identityHysteresis = 100

// abs64 is |x|.
func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// identityIdleRounds is how many planning rounds an identity with its own
// shares may go without demand anywhere before it goes back to the
// default shares.
const identityIdleRounds = 30

// IdentityPlan is the coordinator's plan of one quota's identity shares:
// which identities hold shares of their own (an identity whose demand in
// a region is more than that region's default share, so it lives in few
// regions), and each region's target for them, split by that identity's
// own demand. Every other identity is enforced at its region's default
// share. It is pure and not safe for concurrent use.
type IdentityPlan struct {
	max     int
	edge    bool                        // the quota is served at the edge (SetEdge)
	held    Held                        // the most demands held per instance and per region
	reports map[instanceOf]*report      // each agent instance's last report
	regions map[string]int              // demands held per region, over its instances
	demand  map[string]map[string]int64 // identity -> region -> demand, summed over the region's instances
	targets map[string]map[string]int64 // identity -> region -> target
	// quiet are the planned identities within the default share
	// everywhere, each with the round that began; waiting the unplanned
	// ones over it. Whether an identity is over changes only with its
	// demand or the defaults, so a round looks at those alone.
	quiet    map[string]int64
	waiting  map[string]bool
	defaults map[string]int64 // the last round's
	round    int64
	// dirty are the identities whose demand changed since the last round:
	// only their splits are computed again (all of them when the total or
	// the regions changed, which inputs says).
	dirty  map[string]bool
	inputs string
	// byRegion is targets by region, kept in step with it, so that a
	// region's renewal reads its targets without building them.
	byRegion map[string]map[string]int64
	// Unfit counts the identities that asked for shares of their own in the
	// last round and did not get them: max was reached.
	Unfit int
	// Ignored counts the identity demands not taken since the plan began:
	// new identities beyond what an instance or its region may hold (Held).
	Ignored int64
}

// instanceOf names one agent instance of a region.
type instanceOf struct{ region, instance string }

// report is an instance's identity demands and the rounds since it sent
// them.
type report struct {
	nonce   string // the process that sent it
	demands map[string]int64
	age     int
}

// reportRounds is how many planning rounds an instance's report counts
// for: several renewal intervals, so a live instance always counts and one
// that stopped renewing soon does not.
const reportRounds = 30

// NewIdentityPlan returns an empty plan of at most max identity shares,
// holding at most HeldFor(max) demands.
func NewIdentityPlan(max int) *IdentityPlan {
	return &IdentityPlan{max: max, held: HeldFor(max), reports: map[instanceOf]*report{}, regions: map[string]int{},
		demand: map[string]map[string]int64{}, targets: map[string]map[string]int64{}, quiet: map[string]int64{},
		waiting: map[string]bool{}, dirty: map[string]bool{}, byRegion: map[string]map[string]int64{}}
}

// Update applies an agent instance's changed identity demands (amount
// units, DemandReport.Changes: absolute values, 0 for gone) to its report,
// from its renewal. held is how many demands the instance believes the
// plan holds for it; when the plan holds another number (a new leader, a
// new process of the instance, a report aged out) it starts the report
// afresh from changes and returns false: the instance should then count
// only changes as held (DemandReport.Reset, then Sent) and send the rest
// again. A new process that reports nothing yet keeps its predecessor's
// report until it does. A region's demand for an identity is the sum over
// its instances, as its demand for the quota is (each instance sees part
// of the region's traffic).
//
// A new identity beyond what the instance or its region may hold (Held) is
// not taken, and counted in Ignored, so a report's cost and the plan's
// size stay bounded whatever a caller sends; the answer is then false, as
// the instance no longer holds what it believes.
func (p *IdentityPlan) Update(region, instance, nonce string, held int, changes map[string]int64) bool {
	in := instanceOf{region, instance}
	r := p.reports[in]
	known := r != nil && r.nonce == nonce && len(r.demands) == held
	if !known && r != nil && r.nonce != nonce && held == 0 && len(changes) == 0 {
		// A new process of the instance (a restart) that has measured
		// nothing yet: its predecessor's demands stand for it until it
		// reports its own, so the region's shares do not fall to nothing
		// meanwhile and come back; it ages as a report not renewed does,
		// so one that never reports lets it go.
		r.nonce = nonce
		return false
	}
	if !known {
		p.forget(in)
		r = &report{nonce: nonce, demands: map[string]int64{}}
		p.reports[in] = r
	}
	r.age = 0
	// Removals first, so that a renewal that replaces identities at the
	// cap makes room before it adds.
	ids := slices.SortedFunc(maps.Keys(changes), func(a, b string) int {
		return cmp.Compare(min(1, changes[a]), min(1, changes[b]))
	})
	for _, id := range ids {
		d := max(changes[id], 0)
		old, had := r.demands[id]
		if !had && d > 0 && (len(r.demands) >= p.held.Instance || p.regions[region] >= p.held.Region) {
			p.Ignored++
			known = false
			continue
		}
		p.add(id, region, d-old)
		switch {
		case d == 0 && had:
			delete(r.demands, id)
			p.regions[region]--
		case d > 0:
			r.demands[id] = d
			if !had {
				p.regions[region]++
			}
		}
	}
	return known
}

// forget takes instance in's report out of the regional demands.
func (p *IdentityPlan) forget(in instanceOf) {
	if old := p.reports[in]; old != nil {
		for id, d := range old.demands {
			p.add(id, in.region, -d)
		}
		if p.regions[in.region] -= len(old.demands); p.regions[in.region] <= 0 {
			delete(p.regions, in.region)
		}
		delete(p.reports, in)
	}
}

// add adds d to id's demand in region, dropping what comes to nothing.
func (p *IdentityPlan) add(id, region string, d int64) {
	if d == 0 {
		return
	}
	p.dirty[id] = true
	by := p.demand[id]
	if by == nil {
		by = map[string]int64{}
		p.demand[id] = by
	}
	if by[region] += d; by[region] <= 0 {
		delete(by, region)
		if len(by) == 0 {
			delete(p.demand, id)
		}
	}
}

// Plan is one planning round for a quota of total amount whose regions
// have the default targets defaults: identities whose demand exceeds a
// region's default target get shares of their own (the hottest first, up
// to max), identities whose demand has been within the default everywhere
// for a while go back to it, and every planned identity's total is split
// among the regions by its own demand (in proportion; what it does not
// ask for, evenly).
func (p *IdentityPlan) Plan(total, useful int64, defaults map[string]int64) {
	for in, r := range p.reports {
		if r.age++; r.age > reportRounds {
			p.forget(in) // an instance that stopped renewing
		}
	}
	p.round++
	if !maps.Equal(defaults, p.defaults) { // every identity may have crossed its default
		p.defaults = maps.Clone(defaults)
		for _, set := range []map[string]bool{p.dirty, p.waiting} {
			for id := range set {
				p.check(id) // among them those whose demand is gone
			}
		}
		for id := range p.targets {
			p.check(id)
		}
		for id := range p.demand {
			p.check(id)
		}
	} else {
		for id := range p.dirty {
			p.check(id)
		}
	}
	for id, since := range p.quiet {
		if p.round-since+1 >= identityIdleRounds {
			p.drop(id)
		}
	}
	room := max(0, p.max-len(p.targets))
	p.Unfit = max(0, len(p.waiting)-room)
	for _, id := range p.hottestWaiting(room) {
		p.targets[id] = nil
		delete(p.waiting, id)
	}
	regions := slices.Sorted(maps.Keys(defaults))
	all := false
	if in := fmt.Sprint(total, regions); in != p.inputs {
		p.inputs, all = in, true
		clear(p.byRegion)
		for _, r := range regions {
			p.byRegion[r] = map[string]int64{}
		}
	}
	for id, prev := range p.targets {
		if prev != nil && !all && !p.dirty[id] {
			continue // its demand did not change: neither does its split
		}
		next := p.split(id, total, useful, regions)
		if next == nil {
			p.drop(id) // no split: back to the default
			p.check(id)
			continue
		}
		if prev != nil && !all && p.holds(id, prev, next, total) {
			continue // its split serves as well as the new one
		}
		if prev != nil { // damped: small moves are not worth a grant
			old, ideal := make([]int64, len(regions)), make([]int64, len(regions))
			for i, region := range regions {
				old[i], ideal[i] = prev[region], next[region]
			}
			damping := allocation.Damping{Hysteresis: total / identityHysteresis}
			for i, t := range allocation.Damp(old, ideal, nil, total, damping) {
				next[regions[i]] = t
			}
		}
		p.targets[id] = next
		for region, m := range p.byRegion {
			m[id] = next[region]
		}
	}
	clear(p.dirty)
}

// drop gives identity id back to the default shares.
func (p *IdentityPlan) drop(id string) {
	delete(p.targets, id)
	delete(p.quiet, id)
	for _, m := range p.byRegion {
		delete(m, id)
	}
}

// check files id, whose demand or defaults changed, as quiet (planned,
// within the default everywhere since this round) or waiting (unplanned,
// over the default somewhere), or neither.
func (p *IdentityPlan) check(id string) {
	over := p.over(id, p.defaults)
	_, planned := p.targets[id]
	switch {
	case planned && over:
		delete(p.quiet, id)
	case planned:
		if _, ok := p.quiet[id]; !ok {
			p.quiet[id] = p.round
		}
	case over:
		p.waiting[id] = true
	default:
		delete(p.waiting, id)
	}
}

// over reports whether id asks for more than the default share in some
// region: whether its own shares serve it better than the default.
func (p *IdentityPlan) over(id string, defaults map[string]int64) bool {
	for region, d := range p.demand[id] {
		if d > defaults[region] {
			return true
		}
	}
	return false
}

// usefulShares and sparseFraction say which regions get none of an
// identity's split when it asks for more than its limit (sparse).
const usefulShares, sparseFraction = 3, 6

// sparse reports whether a region asking d of an identity that asks sum in
// all, more than its total, gets none of it: its part by demand would be
// below one least useful share (useful, UsefulShare: a bucket that cannot
// hold a request), or it asks for less than usefulShares least useful
// shares and less than a sixth of the identity's demand. A bucket that
// holds a request or two, refilled slowly for a trickle of requests, is
// full much of the time and wastes what it is given, which the regions
// asking for more would have admitted (follow-the-sun: the night regions
// held 7% of the hot tenant's limit and admitted little of it).
func sparse(d, sum, total, useful int64) bool {
	part := float64(total) * float64(d) / float64(sum)
	return part < float64(useful) || (d < usefulShares*useful && d*sparseFraction < sum)
}

// split divides total among regions (sorted) for identity id by its
// demand. When the identity asks for more than total, the sparse regions
// get none of it.
func (p *IdentityPlan) split(id string, total, useful int64, regions []string) map[string]int64 {
	in := make([]allocation.Region, len(regions))
	var sum int64
	for i, region := range regions {
		in[i] = allocation.Region{Name: region, Weight: 1, Demand: min(p.demand[id][region], total)}
		sum += in[i].Demand
	}
	if sum > total && useful > 0 {
		for changed := true; changed; {
			changed = false
			for i := range in {
				if d := in[i].Demand; d > 0 && d < sum && sparse(d, sum, total, useful) {
					in[i].Demand, sum, changed = 0, sum-d, true
				}
			}
		}
	}
	shares, err := allocation.Allocate(allocation.StrategyDemand, total, in)
	if err != nil {
		return nil // cannot happen: no floors
	}
	out := make(map[string]int64, len(in))
	for i, r := range in {
		out[r.Name] = shares[i]
	}
	return out
}

// hottest is id's largest demand in any region.
func (p *IdentityPlan) hottest(id string) int64 {
	var h int64
	for _, d := range p.demand[id] {
		h = max(h, d)
	}
	return h
}

// Targets returns region's targets for the identities with shares of
// their own, for its next grant (Targets.Identities). The map is the
// plan's own: callers read it and never change it.
func (p *IdentityPlan) Targets(region string) map[string]int64 {
	if len(p.targets) == 0 {
		return nil
	}
	if m, ok := p.byRegion[region]; ok {
		return m
	}
	out := make(map[string]int64, len(p.targets)) // a region the last round did not plan: 0 each
	for id := range p.targets {
		out[id] = 0
	}
	return out
}

// SetMax changes the most identities that may hold shares of their own (a
// policy change), and with it the most demands held (HeldFor). Identities
// above a lowered max keep theirs until idle, and reports above a lowered
// hold keep what they hold until it is gone.
func (p *IdentityPlan) SetMax(max int) { p.max, p.held = max, HeldFor(max) }

// SetEdge says whether the quota is served at the edge (policy.Edge): a
// region's share of an identity is then split again into Envoy instances'
// token buckets, and a region held well below its part gets buckets too
// small to use what it holds (a bucket of a token or two wastes what it
// refills while full: a region held at 29 of its 50 admitted 25). A split
// is then kept (holds) only while every region has three quarters of its
// part, not half.
func (p *IdentityPlan) SetEdge(edge bool) { p.edge = edge }

// tooLow reports whether a region given o of an identity, whose part of
// its current demand is t, has too little to keep the split it holds.
func (p *IdentityPlan) tooLow(o, t int64) bool {
	if p.edge {
		return 4*o < 3*t
	}
	return 2*o < t
}

// Held is how many identity demands the plan holds, over every instance.
func (p *IdentityPlan) Held() int {
	n := 0
	for _, c := range p.regions {
		n += c
	}
	return n
}

// Len is how many identities hold shares of their own.
func (p *IdentityPlan) Len() int { return len(p.targets) }

// holds reports whether identity id's split prev still serves it as well
// as ideal, the split of its current demand, so that it is kept: the
// identity asks for more than total, prev gives all of it, and every
// region keeps asking for what prev gives it (up to a fifth less: the
// demand is measured over a few seconds) and gets at least half of its
// part in ideal (three quarters at the edge: SetEdge). An identity asking
// for more than its limit everywhere admits about its limit whatever the
// exact split; what costs is moving it, since a region grows only once
// another's shrink is acknowledged (hot-tenant: splits that followed the
// noise in the demand kept 3% of the hot tenant's limit in flight).
func (p *IdentityPlan) holds(id string, prev, ideal map[string]int64, total int64) bool {
	var given, asked int64
	for _, d := range p.demand[id] {
		asked += d
	}
	if asked <= total {
		return false
	}
	for region, t := range ideal {
		o := prev[region]
		given += o
		if 4*o > 5*p.demand[id][region] || p.tooLow(o, t) {
			return false
		}
	}
	return given >= total-total/identityHysteresis
}
