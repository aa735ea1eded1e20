package sim

import (
	"container/heap"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/testenv/edgescript"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// The simulator's edge rounds send what the agent's send: the scripted
// reports, stream ends, store outage and capacity moves of
// internal/testenv/edgescript go through the simulated agent's RLQS side
// (report, open, close, its rounds as it schedules them, its region's
// Redis), with the script's leases; every action sent must be the one
// recorded, which the agent's test (internal/agent
// TestEdgeRoundsAsTheSimulator in internal/agent/rlqs) checks its own against.
func TestEdgeRoundsAsTheAgent(t *testing.T) {
	s, err := scenario.Parse([]byte("name: edge-rounds\nduration: 1m\nregions: [us]\npolicy:\n  " +
		strings.ReplaceAll(strings.TrimSpace(edgescript.PolicyYAML), "\n", "\n  ") +
		"\nlease: {drift: 0.0001}\nedge: {instances: 4}\ngroups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}, edge: 1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(s)
	e.ids = &identities{p: e.policy, index: map[string]int{}}
	e.edgeRes, e.follow = &EdgeResult{}, &followTracker{e: e}
	r := &region{name: "us", anchorRegion: edgescript.Base,
		holder: lease.NewHolder(lease.DefaultTiming, e.policy.Failure, e.policy.Limits().Amount()),
		meter:  lease.NewMeter[int](lease.MeterTracks(e.policy.IdentityShareLimit()))}
	e.regions = []*region{r}
	x := e.newEdge(r)
	r.edge = x
	leases := edgescript.NewLeases(e.policy)
	x.cfg = edge.Config{Tuning: edgescript.Tuning(), Drift: edgescript.Drift}
	x.leases, x.gen = leases, 0
	x.start()

	var rec edgescript.Record
	x.sent = func(instance int, id edge.ID, a edge.Send[uint64]) {
		tenant := strings.TrimPrefix(id.Identity, "tenant=")
		rec.Add(time.Duration(e.now)*time.Millisecond, instance, tenant, a.Abandon, a.Bucket, a.TTL)
	}
	stream := map[int]uint64{} // by instance: its open stream
	for _, ev := range edgescript.Events() {
		e.at(ev.At.Milliseconds(), func() {
			switch ev.Kind {
			case "report":
				st := stream[ev.Instance]
				if st == 0 {
					st = x.open(ev.Instance)
					stream[ev.Instance] = st
				}
				id, err := e.ids.add(ev.Tenant)
				if err != nil {
					t.Fatal(err)
				}
				x.report(st, []usage{{id, ev.Allowed, ev.Denied, ev.Elapsed}})
			case "close":
				x.close(stream[ev.Instance])
				delete(stream, ev.Instance)
			case "down", "up":
				r.redisDown = ev.Kind == "down"
			case "capacity":
				leases.Apply(ev)
			}
		})
	}
	e.startEdges()
	for len(e.q) > 0 {
		ev := heap.Pop(&e.q).(*event)
		if ev.t >= edgescript.End.Milliseconds() {
			break
		}
		e.now = ev.t
		ev.do()
	}
	if err := edgescript.Check(&rec); err != nil {
		t.Fatal(err)
	}
}
