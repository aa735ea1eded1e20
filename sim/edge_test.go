package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// runEdge runs edge-shift, cut to dur when positive, with the edge rule
// broken that breakEdge names ("": none).
func runEdge(t *testing.T, dur time.Duration, breakEdge string) *Result {
	t.Helper()
	s, err := Load("scenarios/edge-shift.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if dur > 0 {
		s.Duration = policy.Duration(dur)
	}
	e := newEngine(s)
	e.breakEdge = breakEdge
	res, err := e.run(nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// The edge in edge-shift, counted from every admission of every Envoy
// instance and agent: in every window the identity with the most admitted
// stays within the leased bound (its edge term included), and under the
// identity's limit outright (a static-share policy, reserved: neither the
// assignments, the fallback during eu's agent outage nor us's lapsed
// lease let any tenant above it); the instances decided most requests; a
// demand moved between instances is followed within a report interval
// plus an assignment's life (the old one is counted until it may have
// expired).
func TestEdgeShiftWithinBound(t *testing.T) {
	res := runEdge(t, 0, "")
	m, x := res.Mode("leased"), res.Edge
	if x == nil || x.Requests < 100_000 || x.DirectRequests < 20_000 || x.IdealAdmitted == 0 {
		t.Fatalf("edge result %+v: the edge or the direct path saw too little", x)
	}
	if !m.WithinBound || m.MaxOvershoot != 0 || m.MaxWindow > m.Limit {
		t.Errorf("leased: max window %v (%s at %d ms), limit %v, bound %v: want no overshoot", m.MaxWindow, m.MaxWindowIdentity, m.MaxWindowAtMs, m.Limit, m.Bound)
	}
	if x.EdgeTerm <= 0 || m.BoundTerms["edge"] != x.EdgeTerm {
		t.Errorf("edge term %v, bound terms %v", x.EdgeTerm, m.BoundTerms)
	}
	if want := 6*60/10 - 1; len(x.Windows) < want {
		t.Fatalf("%d windows, want at least %d", len(x.Windows), want)
	}
	for _, w := range x.Windows {
		if !w.Within || w.Total > w.Bound || w.Edge+w.Direct != w.Total {
			t.Errorf("window %+v beyond its bound", w)
		}
	}
	if m.DecisionModes["edge"] != x.Requests || m.DecisionModes["agent-down"] == 0 || m.DecisionModes["degraded"] == 0 {
		t.Errorf("decision modes %v: the edge, eu's agent outage and us's lapsed lease must all show", m.DecisionModes)
	}
	if x.ReportsDropped == 0 || x.Abandons == 0 {
		t.Errorf("%d reports dropped, %d abandons: the outage and the moves must show", x.ReportsDropped, x.Abandons)
	}
	cfg := edge.DefaultConfig()
	follow := EnvoyReportInterval + edge.Lifetime(5*time.Second, 1e-4, cfg.Margin) + 2*cfg.Tick
	moves := 0
	for _, f := range x.Follow {
		if f.Kind != "instances" {
			continue
		}
		moves++
		if f.Assigned90Ms < 0 || time.Duration(f.Assigned90Ms)*time.Millisecond > follow {
			t.Errorf("%+v: 90%% of the capacity assigned where the demand went after %d ms, want within %s", f, f.Assigned90Ms, follow)
		}
	}
	if moves < 3 || x.MaxAssigned90Ms < 0 {
		t.Errorf("%d moves between instances followed, worst %d ms", moves, x.MaxAssigned90Ms)
	}
}

// The edge's rules matter, and the test above would notice each broken:
// Envoy instances that never apply an assignment keep their no-assignment
// behaviour (deny) and the edge admits next to nothing; direct checks that
// take the region's whole capacity, not leaving the edge its reservation,
// let the tenants sending both ways above their limit.
func TestEdgeRulesMatter(t *testing.T) {
	const dur = 40 * time.Second
	ok := runEdge(t, dur, "")
	ignored := runEdge(t, dur, "assignments")
	if u, v := ok.Edge.Utilization, ignored.Edge.Utilization; u < 0.3 || v > 0.05 {
		t.Errorf("edge utilization %.3f, %.3f with assignments ignored: want well above 0.3, and near 0", u, v)
	}
	overlap := runEdge(t, dur, "reservations")
	if m := ok.Mode("leased"); m.MaxOvershoot != 0 {
		t.Errorf("leased overshoot %v with the reservation kept, want 0", m.MaxOvershoot)
	}
	if m := overlap.Mode("leased"); m.MaxOvershoot <= 0 || !strings.HasPrefix(m.MaxWindowIdentity, "tenant=mixed-") {
		t.Errorf("direct checks ignoring the edge's reservation: overshoot %v (%s), want the mixed tenants above their limit", m.MaxOvershoot, m.MaxWindowIdentity)
	}
}

// Same seed, same edge: every output file byte for byte (a shortened
// run, with decisions).
func TestEdgeDeterministic(t *testing.T) {
	var outs [2][]byte
	for i := range outs {
		s, err := Load("scenarios/edge-shift.yaml")
		if err != nil {
			t.Fatal(err)
		}
		s.Duration = policy.Duration(60 * time.Second)
		dir := t.TempDir()
		if _, err := RunToDir(s, dir, true, nil); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"summary.json", "decisions.jsonl", "report.html"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || len(b) == 0 {
				t.Fatalf("%s: %v (%d bytes)", f, err, len(b))
			}
			outs[i] = append(outs[i], b...)
		}
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two runs of edge-shift differ")
	}
	if !bytes.Contains(outs[0], []byte(`"mode":"edge"`)) || !bytes.Contains(outs[0], []byte(`"edge": {`)) {
		t.Fatal("the outputs lack the edge's decisions or summary")
	}
}

// The simulator's model of the region's reservations is the agent's
// script: random updates from three agents (growth, shrinking, demands
// only, another's capacity, instance places, an agent succeeding the
// one before it) go through both, the model and
// internal/agent/lua/edge_sync.lua on a real redis-server, and every
// grant and every sum of the others must match.
func TestEdgeStoreAsTheScript(t *testing.T) {
	lua, err := os.ReadFile("../internal/agent/lua/edge_sync.lua")
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(string(lua))
	rdb := redistest.Start(t).Client(t)
	ctx := context.Background()
	s, err := Load("scenarios/edge-shift.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(s)
	r := &region{name: "us"}
	x := &edgeRegion{e: e, r: r, res: map[int]map[int]reservation{}}
	r.edge = x
	rng := rand.New(rand.NewPCG(7, 8))
	const ids, capacity = 3, 1000
	for step := 0; step < 400; step++ {
		x.gen = rng.IntN(3)
		var idx []int
		var ups []edge.Update
		var args []any
		for id := 0; id < ids; id++ {
			if rng.IntN(3) == 0 {
				continue
			}
			u := edge.Update{Want: rng.Int64N(capacity), Capacity: capacity - rng.Int64N(200), Instances: rng.Int64N(6), Most: 4,
				Largest: rng.Int64N(300), Life: time.Hour}
			if rng.IntN(4) == 0 {
				u.Want = 0
			}
			if rng.IntN(2) == 0 {
				u.EdgeDemand, u.Direct = rng.Int64N(500), rng.Int64N(500)
			}
			idx, ups = append(idx, id), append(ups, u)
			args = append(args, strconv.Itoa(id), u.Want, u.Capacity, u.EdgeDemand, u.Direct, u.Life.Milliseconds(), u.Instances, u.Most, u.Largest)
		}
		granted, others := x.sync(idx, ups)
		args = append(args, "full", "0", 1000, "") // read the whole hash: three fields are one page
		keys := []string{"ql:edge:{us}", "ql:edgelog:{us}", "ql:edgeseq:{us}"}
		got, err := script.Run(ctx, rdb, keys, append([]any{strconv.Itoa(x.gen), strconv.Itoa(x.gen - 1), len(idx)}, args...)...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if got[3] != "0" {
			t.Fatalf("step %d: the read did not end in one page (cursor %v)", step, got[3])
		}
		// What moved from the agent before is compared but for its time
		// left: the model's clock is not Redis's.
		var flat []int64
		gs := got[1].([]any)
		for i, g := range granted {
			in := g.Inherited
			flat = append(flat, g.Reserved, g.Places, in.Reserved, in.Largest, in.Places, in.Edge, in.Direct)
			gs = append(gs[:7*i+5], gs[7*i+6:]...)
		}
		if want := fmt.Sprint(gs); fmt.Sprint(strs(flat)) != want {
			t.Fatalf("step %d, agent %d: the model granted %v, the script %v", step, x.gen, granted, want)
		}
		if sums := scriptSums(t, got[2].([]any), strconv.Itoa(x.gen)); !maps.Equal(sums, others) {
			t.Fatalf("step %d: the model sums %v, the script %v", step, others, sums)
		}
		// Every agent's reservation and places, as stored.
		stored := map[[2]int][3]int64{}
		for f, v := range rdb.HGetAll(ctx, "ql:edge:{us}").Val() {
			id, _ := strconv.Atoi(f)
			for _, line := range strings.Split(v, "\n") {
				var gen int
				var r, e, d, exp, places, largest int64
				if _, err := fmt.Sscan(line, &gen, &r, &e, &d, &exp, &places, &largest); err != nil {
					t.Fatalf("entry %q: %v", line, err)
				}
				stored[[2]int{id, gen}] = [3]int64{r, places, largest}
			}
		}
		model := map[[2]int][3]int64{}
		for id, es := range x.res {
			for gen, en := range es {
				model[[2]int{id, gen}] = [3]int64{en.reserved, en.places, en.largest}
			}
		}
		if !maps.Equal(stored, model) {
			t.Fatalf("step %d: the model holds %v, the script %v (identity and agent: reserved, places, largest)", step, model, stored)
		}
	}
}

// scriptSums sums, by identity, the entries of agents other than me in
// the fields a whole read returned (their expiry is an hour away).
func scriptSums(t *testing.T, fields []any, me string) map[int]edge.Others {
	t.Helper()
	out := map[int]edge.Others{}
	for i := 0; i < len(fields); i += 2 {
		id, _ := strconv.Atoi(fields[i].(string))
		var o edge.Others
		for _, line := range strings.Split(fields[i+1].(string), "\n") {
			var who string
			var r, e, d int64
			if _, err := fmt.Sscan(line, &who, &r, &e, &d); err != nil {
				t.Fatalf("entry %q: %v", line, err)
			}
			if who != me {
				o.Reserved, o.Edge, o.Direct = o.Reserved+r, o.Edge+e, o.Direct+d
			}
		}
		if o != (edge.Others{}) {
			out[id] = o
		}
	}
	return out
}

func strs(v []int64) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = strconv.FormatInt(x, 10)
	}
	return out
}

// Bad edge settings are refused with what to change.
func TestBadEdgeScenarios(t *testing.T) {
	base := "name: x\nduration: 1m\nregions: [us]\npolicy: {name: p, identity: [t], limit: 10, period: 1s%s}\n%sgroups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}%s}]\n%s"
	edgePol := ", edge: {instances: 2, no_assignment: deny}"
	cases := []struct{ pol, edge, group, events, want string }{
		{"", "edge: {instances: 1}\n", ", edge: 1", "", "no edge settings"},
		{edgePol, "edge: {instances: 3}\n", ", edge: 1", "", "1 to 2 instances"},
		{edgePol, "", ", edge: 1", "", "has none"},
		{edgePol, "edge: {instances: 2}\n", "", "", "no group sends"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1.5", "", "edge must be in [0, 1]"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, instances: [1, 1, 1]", "", "at least 3 instances"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, instances: [0, 0]", "", "no instance with a positive weight"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, moves: [{at: 1s}]", "", "moves nothing"},
		{edgePol, "edge: {instances: 2, burst_fraction: 1}\n", ", edge: 1", "", "burst_fraction"},
		{edgePol, "edge: {instances: 2, report_interval: 500ms}\n", ", edge: 1", "", "report_interval"},
		{edgePol, "", "", "events: [{kind: agent-outage, region: us, at: 1s, for: 1s}]\n", "needs an edge"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1", "events: [{kind: edge-partition, region: us, at: 1s}]\n", "positive 'for'"},
	}
	for _, c := range cases {
		y := fmt.Sprintf(base, c.pol, c.edge, c.group, c.events)
		_, err := Parse([]byte(y))
		if err == nil || !errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s\n got %v\n want %q", y, err, c.want)
		}
	}
}
