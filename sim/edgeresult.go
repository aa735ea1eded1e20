package sim

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// EdgeResult is what the edge did, in summary.json (scenarios with an
// edge): requests decided by Envoy instances and by direct checks, the
// stream's traffic, per window the identity with the most admitted against
// the leased bound (edge term included), and how fast edge shares followed
// demand when it moved.
type EdgeResult struct {
	// Instances is the number of Envoy instances per region.
	Instances int `json:"instances"`
	// Requests and Admitted were decided by Envoy instances; the direct
	// ones by the regions' agents.
	Requests int64 `json:"requests"`
	Admitted int64 `json:"admitted"`
	// IdealAdmitted is how many of Requests the ideal limiter admitted;
	// Utilization is Admitted over it.
	IdealAdmitted  int64   `json:"ideal_admitted"`
	Utilization    float64 `json:"utilization"`
	DirectRequests int64   `json:"direct_requests"`
	DirectAdmitted int64   `json:"direct_admitted"`
	// Reports are the usage reports the instances built; ReportsDropped
	// those with no stream to go on (their counts are lost, as in Envoy).
	Reports        int64 `json:"reports"`
	ReportsDropped int64 `json:"reports_dropped"`
	// Assignments and Abandons are the actions the agents sent.
	Assignments int64 `json:"assignments"`
	Abandons    int64 `json:"abandons"`
	// EdgeTerm is the leased bound's edge term (the policy in force at the
	// end): what Envoy instances may admit on their own fallback.
	EdgeTerm float64 `json:"edge_term"`
	// Windows are the run's back-to-back windows: in each, the identity
	// with the most admitted (edge and direct), against the leased bound.
	Windows []EdgeWindow `json:"windows"`
	// Follow is, per move of a group's demand, how long until its tenants
	// got 90% of what they may have where the demand went; the Max fields
	// are the worst over moves between instances (-1: one never did).
	Follow          []EdgeFollow `json:"follow,omitempty"`
	MaxAssigned90Ms int64        `json:"max_assigned_90_ms"`
	MaxAdmitted90Ms int64        `json:"max_admitted_90_ms"`
}

// EdgeWindow is one window of the run (units).
type EdgeWindow struct {
	StartMs  int64   `json:"start_ms"`
	Identity string  `json:"identity"`
	Edge     float64 `json:"edge"`
	Direct   float64 `json:"direct"`
	Total    float64 `json:"total"`
	// Bound is the leased bound for the window (its epoch's; the
	// transition's for a window ending in one).
	Bound  float64 `json:"bound"`
	Within bool    `json:"within"`
}

// EdgeFollow is one move of a group's demand. Kind "instances": within a
// region, to instances that had none of it; the target is the region's
// capacity for each tenant (its lease, at the time). Kind "regions": to a
// region that had none of it; the target is the policy's whole limit.
// Assigned90Ms is when the token buckets assigned to where the demand went
// first refilled at 90% of the target, Admitted90Ms when they first
// admitted that much in a second, both after AtMs and for the slowest
// tenant (-1: not within the run or before the group's next move). The
// target is read at each instant (a lease that shrinks lowers it); Target
// is the first tenant's at the move.
type EdgeFollow struct {
	Group        string  `json:"group"`
	Kind         string  `json:"kind"`
	Region       string  `json:"region"`
	To           []int   `json:"to,omitempty"`
	AtMs         int64   `json:"at_ms"`
	Target       float64 `json:"target_per_s"`
	Assigned90Ms int64   `json:"assigned_90_ms"`
	Admitted90Ms int64   `json:"admitted_90_ms"`
}

// count counts an action an agent sent.
func (r *EdgeResult) count(a edge.Send[uint64]) {
	if a.Abandon {
		r.Abandons++
	} else {
		r.Assignments++
	}
}

// edgeWindows adds up leased admissions per identity in back-to-back
// windows, edge and direct apart, keeping each finished window's largest.
type edgeWindows struct {
	w    int64 // ms
	cur  int64 // the current window's index
	sums map[int][2]int64
	rows []EdgeWindow
	ids  *identities
}

func (ew *edgeWindows) add(identity int, atMs, cost int64, viaEdge bool) {
	if i := atMs / ew.w; i != ew.cur {
		ew.flush()
		ew.cur = i
	}
	s := ew.sums[identity]
	if viaEdge {
		s[0] += cost
	} else {
		s[1] += cost
	}
	ew.sums[identity] = s
}

// flush closes the current window.
func (ew *edgeWindows) flush() {
	if len(ew.sums) == 0 {
		return
	}
	best, bestID := int64(-1), 0
	for _, id := range slices.Sorted(maps.Keys(ew.sums)) {
		if s := ew.sums[id]; s[0]+s[1] > best {
			best, bestID = s[0]+s[1], id
		}
	}
	s := ew.sums[bestID]
	ew.rows = append(ew.rows, EdgeWindow{
		StartMs:  ew.cur * ew.w,
		Identity: ew.ids.names[bestID],
		Edge:     policy.Units(s[0]),
		Direct:   policy.Units(s[1]),
		Total:    policy.Units(s[0] + s[1]),
	})
	ew.sums = map[int][2]int64{}
}

// finishEdge completes the edge result: the last full window, each
// window's bound, the followers still open.
func (e *engine) finishEdge(leased *ModeResult) {
	r := e.edgeRes
	durMs := time.Duration(e.s.Duration).Milliseconds()
	if (e.edgeWin.cur+1)*e.edgeWin.w <= durMs {
		e.edgeWin.flush()
	}
	for _, w := range e.edgeWin.rows {
		end := w.StartMs + e.edgeWin.w
		for i, ep := range e.epochs {
			if ep.startMs >= end && i > 0 {
				break
			}
			w.Bound = leased.Epochs[i].Bound
			if end < ep.transitionMs {
				w.Bound = leased.Epochs[i].TransitionBound
			}
		}
		w.Within = w.Total <= w.Bound*(1+1e-9)
		r.Windows = append(r.Windows, w)
	}
	r.EdgeTerm = leased.BoundTerms["edge"]
	if r.IdealAdmitted > 0 {
		r.Utilization = float64(r.Admitted) / float64(r.IdealAdmitted)
	}
	e.follow.closeAll()
	r.Follow = e.follow.results
	for _, f := range r.Follow {
		if f.Kind != "instances" {
			continue
		}
		r.MaxAssigned90Ms = worstFollow(r.MaxAssigned90Ms, f.Assigned90Ms)
		r.MaxAdmitted90Ms = worstFollow(r.MaxAdmitted90Ms, f.Admitted90Ms)
	}
}

// worstFollow is the slower of two times to follow, -1 (never) slowest.
func worstFollow(a, b int64) int64 {
	if a < 0 || b < 0 {
		return -1
	}
	return max(a, b)
}

// followTracker watches every move of a group's edge demand until its
// tenants got 90% of their target where it went.
type followTracker struct {
	e       *engine
	open    []*follower
	results []EdgeFollow
}

type follower struct {
	EdgeFollow
	group   int
	region  *region
	dest    map[int]bool // instances (nil: all of the region's)
	tenants map[int]*followed
	left    int // tenants not yet at 90% both ways
}

type followed struct {
	admits             []int64 // ms of the admissions at dest in the last second
	assigned, admitted bool
}

// start watches group gi's move m.
func (ft *followTracker) start(gi int, m scenario.Move) {
	e := ft.e
	g := &e.s.Groups[gi]
	for _, f := range ft.open {
		if f.group == gi {
			ft.close(f)
		}
	}
	ft.open = slices.DeleteFunc(ft.open, func(f *follower) bool { return f.group == gi })
	at := time.Duration(m.At)
	oldR, newR := g.Weights(at-1), g.Weights(at)
	oldI, newI := g.InstanceWeights(at-1), g.InstanceWeights(at)
	weight := func(w []float64, i int) float64 {
		if w == nil {
			return 1
		}
		if i < len(w) {
			return w[i]
		}
		return 0
	}
	for _, r := range e.regions {
		if newR[r.name] <= 0 {
			continue
		}
		f := &follower{
			EdgeFollow: EdgeFollow{Group: g.Name, Region: r.name, AtMs: e.now, Assigned90Ms: -1, Admitted90Ms: -1},
			group:      gi,
			region:     r,
		}
		if oldR[r.name] <= 0 {
			f.Kind, f.Target = "regions", tokens.ShapeOf(e.policy, e.policy.Limits().Amount()).Rate
		} else {
			f.Kind, f.dest = "instances", map[int]bool{}
			for i := range r.edge.envoys {
				if weight(newI, i) > 0 && weight(oldI, i) <= 0 {
					f.dest[i] = true
					f.To = append(f.To, i)
				}
			}
			if len(f.dest) == 0 {
				continue
			}
		}
		f.tenants = map[int]*followed{}
		for t := 0; t < g.Tenants; t++ {
			f.tenants[e.groupIDs[gi]+t] = &followed{}
		}
		f.Target = f.target(e, e.groupIDs[gi])
		f.left = len(f.tenants)
		ft.open = append(ft.open, f)
	}
}

// target is what tenant id may have where f's demand went, per second,
// now.
func (f *follower) target(e *engine, id int) float64 {
	if f.Kind == "regions" {
		return tokens.ShapeOf(e.policy, e.policy.Limits().Amount()).Rate
	}
	c, _ := f.region.holder.Enforce(e.ids.names[id], f.region.leaseTime(e.now))
	return tokens.ShapeOf(e.policy, c).Rate
}

// admitted notes an admission at instance in for identity.
func (ft *followTracker) admitted(in *envoyInst, id int) {
	for _, f := range ft.open {
		t := f.tenants[id]
		if t == nil || t.admitted || f.region != in.x.r || f.dest != nil && !f.dest[in.idx] {
			continue
		}
		now := ft.e.now
		t.admits = append(t.admits, now)
		for len(t.admits) > 0 && t.admits[0] <= now-1000 {
			t.admits = t.admits[1:]
		}
		if target := f.target(ft.e, id); float64(len(t.admits)) >= 0.9*target {
			t.admitted = true
			f.Admitted90Ms = max(f.Admitted90Ms, now-f.AtMs)
			ft.reached(f, t)
		}
	}
}

// assigned notes an assignment applied at instance in for identity.
func (ft *followTracker) assigned(in *envoyInst, id int) {
	for _, f := range ft.open {
		t := f.tenants[id]
		if t == nil || t.assigned || f.region != in.x.r || f.dest != nil && !f.dest[in.idx] {
			continue
		}
		var rate float64
		for i, o := range in.x.envoys {
			if f.dest != nil && !f.dest[i] {
				continue
			}
			if b := o.buckets[id]; b != nil {
				if st := b.State(o.mono()); st.Phase == envoy.Assigned && st.Strategy.Kind == envoy.TokenBucket {
					rate += tokens.Bucket{
						MaxTokens:     st.Strategy.Bucket.MaxTokens,
						TokensPerFill: st.Strategy.Bucket.TokensPerFill,
						FillInterval:  st.Strategy.Bucket.FillInterval,
					}.Rate()
				}
			}
		}
		if target := f.target(ft.e, id); rate >= 0.9*target {
			t.assigned = true
			f.Assigned90Ms = max(f.Assigned90Ms, ft.e.now-f.AtMs)
			ft.reached(f, t)
		}
	}
}

func (ft *followTracker) reached(f *follower, t *followed) {
	if t.assigned && t.admitted {
		if f.left--; f.left == 0 {
			ft.close(f)
			ft.open = slices.DeleteFunc(ft.open, func(o *follower) bool { return o == f })
		}
	}
}

// close records f: a tenant that never got there makes its time -1.
func (ft *followTracker) close(f *follower) {
	for _, t := range f.tenants {
		if !t.assigned {
			f.Assigned90Ms = -1
		}
		if !t.admitted {
			f.Admitted90Ms = -1
		}
	}
	f.Target = math.Round(f.Target*100) / 100
	ft.results = append(ft.results, f.EdgeFollow)
}

func (ft *followTracker) closeAll() {
	for _, f := range ft.open {
		ft.close(f)
	}
	ft.open = nil
	slices.SortStableFunc(ft.results, func(a, b EdgeFollow) int { return int(a.AtMs - b.AtMs) })
}
