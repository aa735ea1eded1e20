package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/regional"
	"github.com/quota-lease/quota-lease/sim/scenario"
)

// parityScenario is a short run with every fault the simulator models
// that keeps the store's memory (partitions, outages, flaps, limits
// lowered and raised, a new version, clock drift), for each algorithm.
const parityScenario = `
name: parity
seed: 5
duration: 40s
regions: [us, eu]
policy:
  name: api
  identity: [tenant]
  algorithm: %s
  limit: 30
  period: 1s
  shards: %d%s
  failure: {mode: static-share, static_fraction: 0.2}
window: 5s
tenants: 6
hot_tenant: 0.5
traffic:
  - {region: us, rate: 60}
  - {region: eu, rate: 25}
events:
  - {kind: clock-drift, region: eu, at: 2s, rate: 0.0001}
  - {kind: partition, region: eu, at: 6s, for: 9s}
  - {kind: redis-outage, region: us, at: 17s, for: 1500ms}
  - {kind: redis-flap, region: eu, at: 20s, for: 3s, period: 400ms, down: 150ms}
  - {kind: config-change, at: 25s, limit: 12%s}
  - {kind: config-change, at: 31s, limit: 40%s}
  - {kind: config-change, at: 35s, version: 2}
`

// The simulator decides quota-lease's requests with the agent's admission
// pipeline; only the store is a model. Every request of a run with faults
// goes through a second pipeline, configured as the simulator's but deciding
// on a real redis-server through the regional engine (the agent's store),
// on the same region clock and the same lease, and every answer must be
// the same: decision, mode, limits and the stage that decided it.
func TestSimulatorAdmitsAsTheAgent(t *testing.T) {
	srv := redistest.Start(t)
	for _, alg := range []string{"token_bucket", "fixed_window", "sliding_window", "sliding_log"} {
		for _, shards := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/shards=%d", alg, shards), func(t *testing.T) {
				burst := [3]any{"", "", ""} // a window's burst is its limit
				if alg == "token_bucket" {
					burst = [3]any{"\n  burst: 45", ", burst: 20", ", burst: 60"}
				}
				s, err := scenario.Parse([]byte(fmt.Sprintf(parityScenario, alg, shards, burst[0], burst[1], burst[2])))
				if err != nil {
					t.Fatal(err)
				}
				if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				e := newEngine(s)
				compared, db := 0, 0
				e.wrap = func(r *region, sim admitter) admitter {
					db++ // every region its own Redis database: its own store
					return &tee{t: t, sim: sim, agent: agentPipeline(t, e, r, srv, db), n: &compared}
				}
				res, err := e.run(nil)
				if err != nil {
					t.Fatal(err)
				}
				leased := res.Mode("leased")
				if want := leased.Requests; int64(compared) != want || want < 2000 {
					t.Fatalf("compared %d answers of %d requests (want every one, at least 2,000)", compared, want)
				}
				if modes := leased.DecisionModes; modes["local-fallback"] == 0 || modes["leased"] == 0 || modes["degraded"]+modes["unleased"] == 0 {
					t.Fatalf("decision modes %v: the run missed a path it is meant to compare", modes)
				}
			})
		}
	}
}

// agentPipeline is region r's pipeline as the simulator's, but deciding on
// Redis database db of srv with the regional engine, on r's clock.
func agentPipeline(t *testing.T, e *engine, r *region, srv *redistest.Server, db int) *admission.Pipeline {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: db})
	t.Cleanup(func() { rdb.Close() })
	cfg := regional.DefaultConfig()
	cfg.Clock = regionClock{e, r}
	eng, err := regional.NewEngine(rdb, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.InitStore(context.Background()); err != nil {
		t.Fatal(err)
	}
	p, err := admission.New(simConfig(simPolicies{e}, outageStore{eng, r}, simShares{r}, regionClock{e, r}))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// outageStore is the engine, failing while the simulated region's Redis
// is down.
type outageStore struct {
	eng *regional.Engine
	r   *region
}

func (s outageStore) Decide(ctx context.Context, ts []*admission.Ticket) []admission.Decided {
	if !s.r.redisDown {
		return s.eng.Decide(ctx, ts)
	}
	out := make([]admission.Decided, len(ts))
	for i := range out {
		out[i].Err = errStoreDown
	}
	return out
}

// tee decides every request with both pipelines and fails the test at the
// first answer that differs.
type tee struct {
	t          *testing.T
	sim, agent admitter
	n          *int
}

func (c *tee) Check(ctx context.Context, r admission.Request) (admission.Outcome, error) {
	o, err := c.sim.Check(ctx, r)
	want, wantErr := c.agent.Check(ctx, r)
	if fmt.Sprint(err) != fmt.Sprint(wantErr) || o.Decision != want.Decision || o.Mode != want.Mode || o.Limits != want.Limits || o.Via != want.Via {
		c.t.Fatalf("request %d (%+v): simulator %+v %v, agent on Redis %+v %v", *c.n, r, o, err, want, wantErr)
	}
	*c.n++
	return o, err
}
