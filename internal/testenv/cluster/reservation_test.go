package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// Token budgets reserved and settled (docs/post-hoc.md, "Reservations"),
// end to end: two regions, each with its agent and redis-server, one
// post_hoc fixed window (1000 tokens per user per 2 s). Five conversations
// per region loop for user u1 through their agent's HTTP API: a
// reservation of an estimate of 100-600 tokens, and when admitted a think
// time of 20-200 ms and a settlement of the actual cost, the estimate's
// 80-120% (a 20% estimate error); a refused reservation waits 30-100 ms
// and asks again.
//
// From the client's own records: in no window of the period do the actual
// costs of the requests whose reservations were admitted in it exceed 1.2
// times the published bound without its post-hoc term (what the system
// can admit of estimates), where checks and charges after the fact
// (TestPostHoc) reach the whole post-hoc term; and both regions' Redis
// counted at least every actual cost, and no more than the larger of each
// request's estimate and actual cost (a settlement in a later window than
// its reservation's gives nothing back).
func TestReservationsEndToEnd(t *testing.T) {
	testenv.SkipMultiProcess(t)
	const (
		limit     = 1000
		period    = 2 * time.Second
		perRegion = 5
		traffic   = 12 * time.Second
	)
	yaml := fmt.Sprintf("name: llm-reserved\nidentity: [user]\nalgorithm: fixed_window\nlimit: %d\nperiod: %s\npost_hoc: true\nmax_cost: 720\nmax_in_flight: 10\nfailure: {mode: static-share, static_fraction: 0.1}\n", limit, period)
	c := startWith(t, yaml, Options{Regions: []string{"us", "eu"}, Coordinators: 1, CheckTimeout: 2 * time.Second})
	ctx := t.Context()
	web := serviceClient(t, c)
	waitPostHocLeased(t, c, web, "llm-reserved")
	p := testenv.MustPolicies(t, yaml)[0]

	poll := startPostHocPoller(t, c, "user=u1")

	var mu sync.Mutex
	var reqs []reservedRequest
	end := time.Now().Add(traffic)
	var wg sync.WaitGroup
	for ai, a := range c.Agents {
		for k := range perRegion {
			rnd := rand.New(rand.NewPCG(uint64(100*ai+k+1), 43))
			wg.Go(func() {
				for range 1000 {
					if ctx.Err() != nil || !time.Now().Before(end) {
						return
					}
					r, ok := reserveAndSettle(ctx, web, a, rnd)
					if !ok {
						time.Sleep(time.Duration(30+rnd.IntN(71)) * time.Millisecond)
						continue
					}
					mu.Lock()
					reqs = append(reqs, r)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()

	// The windows close and the poller reads their final counts.
	var rec postHocRecords
	var last time.Time
	var actual, largest int64
	for _, r := range reqs {
		if r.err != "" {
			t.Fatalf("a request in %s: %s", r.region, r.err)
		}
		rec.charges = append(rec.charges, postHocCharge{region: r.region, sent: r.sent, recv: r.recv},
			postHocCharge{region: r.region, sent: r.settleSent, recv: r.settleRecv})
		last = maxTime(last, r.settleRecv)
		actual += r.actual
		largest += max(r.actual, r.estimate)
	}
	poll.finish(t, last, period)
	perWindow, err := poll.windowTotals(p, &rec)
	if err != nil {
		t.Fatal(err)
	}
	var counted int64
	for _, v := range perWindow {
		counted += v
	}
	t.Logf("%d requests reserved and settled: %d tokens actually used, Redis counted %d (at most %d: each request's larger of estimate and actual)",
		len(reqs), actual, counted, largest)
	if len(reqs) < 20 {
		t.Errorf("only %d requests reserved and settled: the run proves little", len(reqs))
	}
	// Every decision was Redis's: the local fallback counts where the
	// Redis sums cannot see.
	for _, a := range c.Agents {
		m := postHocMetrics(t, web, a, p.Name)
		if fb := m[`quotalease_agent_decisions_total|mode="local-fallback"`] + m["quotalease_agent_fallback_after_timeout_total"]; fb > 0 {
			t.Errorf("%s: %v decisions by the local fallback; the Redis accounting cannot see them", a.Region, fb)
		}
	}
	if counted < actual || counted > largest {
		t.Errorf("Redis counted %d tokens; want at least the %d used and at most %d", counted, actual, largest)
	}

	b, err := bound.Compute(p, bound.Deployment{Regions: len(c.Agents), Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: 1e-4}, bound.Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	estimates := b.WorstCase - b.Terms[bound.TermPostHoc]
	used := make([]postHocCharge, len(reqs)) // each request's actual cost where its reservation was decided
	for i, r := range reqs {
		used[i] = postHocCharge{sent: r.sent, recv: r.recv, cost: r.actual, status: http.StatusOK}
	}
	hi, hiEnd := postHocMaxWindow(used, period, true)
	t.Logf("most tokens used by the requests reserved in one %v window: %d; 1.2 x the bound without its post-hoc term: %.1f (post-hoc term %.0f)",
		period, hi, 1.2*estimates, b.Terms[bound.TermPostHoc])
	if float64(hi) > 1.2*estimates {
		t.Errorf("%d tokens used by requests reserved in the window ending %s, more than 1.2 x %.1f", hi, hiEnd.Format("15:04:05.000"), estimates)
	}
}

// reservedRequest is one request as the client saw it: its reservation's
// span and estimate, its settlement's span and actual cost.
type reservedRequest struct {
	region                 string
	sent, recv             time.Time
	settleSent, settleRecv time.Time
	estimate, actual       int64
	err                    string
}

// reserveAndSettle reserves an estimate of 100-600 tokens for u1 at a;
// if admitted, runs 20-200 ms and settles 80-120% of it. ok is false when
// the reservation was refused.
func reserveAndSettle(ctx context.Context, web *http.Client, a *AgentProcess, rnd *rand.Rand) (r reservedRequest, ok bool) {
	r = reservedRequest{region: a.Region, estimate: int64(100 + rnd.IntN(501))}
	r.sent = time.Now()
	status, body, err := reservationCall(ctx, web, a, map[string]any{"cost": r.estimate, "reserve": true})
	r.recv = time.Now()
	if err != nil || status != http.StatusOK {
		if err != nil || status != http.StatusTooManyRequests {
			r.err = fmt.Sprintf("reserve: %d %v %v", status, body, err)
			return r, true
		}
		return r, false
	}
	name, _ := body["reservation"].(string)
	time.Sleep(time.Duration(20+rnd.IntN(181)) * time.Millisecond)
	r.actual = r.estimate * int64(80+rnd.IntN(41)) / 100
	r.settleSent = time.Now()
	status, body, err = reservationCall(ctx, web, a, map[string]any{"cost": r.actual, "settle": name})
	r.settleRecv = time.Now()
	if err != nil || status != http.StatusOK && status != http.StatusTooManyRequests {
		r.err = fmt.Sprintf("settle %s: %d %v %v", name, status, body, err)
	}
	return r, true
}

// reservationCall posts a request of llm-reserved for u1 with the given
// fields to a's HTTP API.
func reservationCall(ctx context.Context, web *http.Client, a *AgentProcess, fields map[string]any) (int, map[string]any, error) {
	body := map[string]any{"policy": "llm-reserved", "attributes": map[string]string{"user": "u1"}}
	for k, v := range fields {
		body[k] = v
	}
	code, out, err := postCheck(ctx, web, a, body)
	if err != nil {
		return 0, nil, err
	}
	var m map[string]any
	_ = json.Unmarshal(out, &m)
	return code, m, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
