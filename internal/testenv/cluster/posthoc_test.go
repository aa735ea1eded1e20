package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/policy"
)

// Token budgets charged after the fact (docs/post-hoc.md), end to end:
// two regions, each with its agent and redis-server, one post_hoc policy
// per algorithm (1000 tokens per user per 2 s, max_cost 600,
// max_in_flight 10). Five "conversations" per region and policy loop for
// user u1 through their region's agent's HTTP API: a check
// ({"check": true}, charging nothing), and when admitted a think time of
// 20-200 ms and a charge of 100-600 tokens, which is counted whether or
// not it still fits; a refused check waits 30-100 ms and asks again. At
// most ten requests of u1 are thus checked and not yet charged at any
// moment, as max_in_flight declares.
//
// From the client's own records (each charge's send and answer times and
// its cost), per policy:
//
//   - every token charged was counted: the units of the refused charges
//     equal the agents' quotalease_agent_post_hoc_over_limit_units_total,
//     and for the windowed algorithms the final counters read from both
//     regions' Redis over every window of the run add up to every token
//     charged (the test polls the counters while they live);
//   - no window of the policy's period holds more charged tokens than
//     bound.Compute(policy, deployment, bound.Leased, 0), post-hoc term
//     included: counting every charge whose [sent, answered] span meets
//     the window, so the count is at least what the system decided in it
//     (and, for the fixed window, the exact per-window sums from Redis);
//   - the post-hoc term was exercised: charges were refused and counted,
//     and Redis saw the identity over its limit (a window counting more
//     than the limit, a bucket in debt).
//
// The three policies run side by side on one deployment for 12 s (six
// periods), every decision Redis's; the subtests hold each one's
// assertions.
func TestPostHoc(t *testing.T) {
	testenv.SkipMultiProcess(t)
	const (
		limit, maxCost, maxInFlight = 1000, 600, 10
		period                      = 2 * time.Second
		perRegion                   = 5 // conversations per region and policy
		traffic                     = 12 * time.Second
	)
	algos := []struct{ algorithm, name, extra string }{
		{"fixed_window", "llm-fixed", ""},
		{"sliding_window", "llm-sliding", ""},
		{"token_bucket", "llm-bucket", "burst: 1000\n"},
	}
	var docs []string
	for _, a := range algos {
		docs = append(docs, fmt.Sprintf("name: %s\nidentity: [user]\nalgorithm: %s\nlimit: %d\nperiod: %s\n%spost_hoc: true\nmax_cost: %d\nmax_in_flight: %d\nfailure: {mode: static-share, static_fraction: 0.1}\n",
			a.name, a.algorithm, limit, period, a.extra, maxCost, maxInFlight))
	}
	yaml := strings.Join(docs, "---\n")
	// A generous check timeout: every decision is Redis's (the local
	// fallback counts in-process, where the Redis sums cannot see it; the
	// test checks that it never decided).
	c := startWith(t, yaml, Options{Regions: []string{"us", "eu"}, Coordinators: 1, CheckTimeout: 2 * time.Second})
	ctx := t.Context()
	web := serviceClient(t, c)

	// Every region holds a lease of every policy before the traffic starts
	// (unleased, a region has no share, and would refuse charges without
	// counting them).
	for _, al := range algos {
		waitPostHocLeased(t, c, web, al.name)
	}

	pols := map[string]*policy.Policy{}
	for _, p := range testenv.MustPolicies(t, yaml) {
		pols[p.Name] = p
	}
	run := &postHocRun{records: map[string]*postHocRecords{}}
	for _, al := range algos {
		run.records[al.name] = &postHocRecords{}
	}
	poll := startPostHocPoller(t, c, "user=u1")

	began := time.Now()
	end := began.Add(traffic)
	var wg sync.WaitGroup
	for pi, al := range algos {
		for ai, a := range c.Agents {
			for k := range perRegion {
				seed := uint64(1000*pi + 100*ai + k + 1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					run.conversation(ctx, web, a, al.name, rand.New(rand.NewPCG(seed, 42)), end)
				}()
			}
		}
	}
	wg.Wait()
	t.Logf("traffic for %v (conversations' seeds 1..%d)", time.Since(began).Round(time.Millisecond), 1000*(len(algos)-1)+100*(len(c.Agents)-1)+perRegion)

	// The windows of the last charges close, and the poller reads their
	// final counts in both regions (a counter lives until its window's end
	// plus a second).
	var last time.Time
	for _, r := range run.records {
		for _, ch := range r.charges {
			if ch.recv.After(last) {
				last = ch.recv
			}
		}
	}
	poll.finish(t, last, period)

	dep := bound.Deployment{Regions: len(c.Agents), Instances: 1, LeaseDuration: c.Opts.LeaseDuration, Drift: 1e-4}
	for _, al := range algos {
		t.Run(al.algorithm, func(t *testing.T) {
			p := pols[al.name]
			rec := run.records[al.name]
			checkPostHoc(t, c, web, p, dep, rec, poll)
		})
	}
}

// serviceClient is an HTTPS client of c's agents with the service
// certificate.
func serviceClient(t *testing.T, c *Cluster) *http.Client {
	t.Helper()
	tlsCfg, err := c.ClientTLS("service")
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// waitPostHocLeased waits until every agent of c holds a lease of the
// post-hoc policy pol: its check of a probe user is decided on a lease
// (unleased, a region has no share, and would refuse charges without
// counting them).
func waitPostHocLeased(t *testing.T, c *Cluster, web *http.Client, pol string) {
	t.Helper()
	for _, a := range c.Agents {
		testenv.WaitFor(t, 30*time.Second, pol+" leased in "+a.Region, func() bool {
			ans := postHocCall(t.Context(), web, a, pol, "probe", 0)
			return ans.err == nil && ans.status == http.StatusOK && ans.mode == "leased"
		})
	}
}

// postCheck posts body as JSON to a's HTTP check API (/v1/check) and
// returns the answer's status and body. Not the run's deadline but 10 s of
// its own: a charge in flight when the run ends is answered, never
// abandoned (its tokens would be counted unseen).
func postCheck(ctx context.Context, web *http.Client, a *AgentProcess, body map[string]any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.HTTP+"/v1/check", bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	resp, err := web.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// postHocSettle is how long after a fixed window's end its counters are
// read as final: a charge the agent sent for a window it had already left
// is taken back in a second round trip (regional/window.go), within
// milliseconds. A counter lives until its window's end plus the agents'
// TTL margin (1 s), and as long again as the poller keeps it
// (postHocKeep).
const postHocSettle = 250 * time.Millisecond

// postHocKeep is how long past its last reading the poller keeps a
// window's counter in Redis, so that a late poll still reads it.
const postHocKeep = 10 * time.Second

// postHocCharge is one charge as the client saw it.
type postHocCharge struct {
	region     string
	sent, recv time.Time
	cost       int64
	status     int // 200 admitted, 429 refused (counted all the same), 0 failed
	mode       string
	err        string
}

type postHocRecords struct {
	charges                                     []postHocCharge
	checksAdmitted, checksRefused, checksFailed int
	lastCheckErr                                string
}

type postHocRun struct {
	mu      sync.Mutex
	records map[string]*postHocRecords
}

// conversation loops until end (or 1000 rounds): a check, and if it is
// admitted a think time and a charge.
func (r *postHocRun) conversation(ctx context.Context, web *http.Client, a *AgentProcess, pol string, rnd *rand.Rand, end time.Time) {
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for range 1000 {
		if ctx.Err() != nil || !time.Now().Before(end) {
			return
		}
		ans := postHocCall(ctx, web, a, pol, "u1", 0)
		r.mu.Lock()
		rec := r.records[pol]
		switch {
		case ans.err != nil:
			rec.checksFailed++
			rec.lastCheckErr = ans.err.Error()
		case ans.status == http.StatusOK:
			rec.checksAdmitted++
		default:
			rec.checksRefused++
		}
		r.mu.Unlock()
		if ans.err != nil || ans.status != http.StatusOK {
			if !wait(time.Duration(30+rnd.IntN(71)) * time.Millisecond) {
				return
			}
			continue
		}
		// The request runs (think time); it is charged when it ends, also
		// past end: it was admitted, so its tokens are spent.
		time.Sleep(time.Duration(20+rnd.IntN(181)) * time.Millisecond)
		cost := int64(100 + rnd.IntN(501))
		sent := time.Now()
		ans = postHocCall(ctx, web, a, pol, "u1", cost)
		ch := postHocCharge{region: a.Region, sent: sent, recv: time.Now(), cost: cost, status: ans.status, mode: ans.mode}
		if ans.err != nil {
			ch.status, ch.err = 0, ans.err.Error()
		}
		r.mu.Lock()
		r.records[pol].charges = append(r.records[pol].charges, ch)
		r.mu.Unlock()
	}
}

type postHocAnswer struct {
	status int
	mode   string
	err    error
}

// postHocCall sends a check (cost 0) or a charge of cost for user to a's
// HTTP API: 200 admitted, 429 refused; anything else is an error.
func postHocCall(ctx context.Context, web *http.Client, a *AgentProcess, pol, user string, cost int64) postHocAnswer {
	body := map[string]any{"policy": pol, "attributes": map[string]string{"user": user}}
	if cost == 0 {
		body["check"] = true
	} else {
		body["cost"] = cost
	}
	code, out, err := postCheck(ctx, web, a, body)
	if err != nil {
		return postHocAnswer{err: err}
	}
	switch code {
	case http.StatusOK:
		var ans struct {
			Allowed bool   `json:"allowed"`
			Mode    string `json:"mode"`
		}
		if err := json.Unmarshal(out, &ans); err != nil || !ans.Allowed {
			return postHocAnswer{err: fmt.Errorf("200 with %q", out)}
		}
		return postHocAnswer{status: 200, mode: ans.Mode}
	case http.StatusTooManyRequests:
		return postHocAnswer{status: 429}
	default:
		return postHocAnswer{err: fmt.Errorf("%d %s", code, bytes.TrimSpace(out))}
	}
}

// checkPostHoc asserts one policy's accounting and bound.
func checkPostHoc(t *testing.T, c *Cluster, web *http.Client, p *policy.Policy, dep bound.Deployment, rec *postHocRecords, poll *postHocPoller) {
	b, err := bound.Compute(p, dep, bound.Leased, 0)
	if err != nil {
		t.Fatal(err)
	}
	var charged, refusedUnits, failedUnits int64
	var admitted, refused, failed int
	modes := map[string]int{} // of the admitted charges (a refusal names none)
	for _, ch := range rec.charges {
		switch ch.status {
		case http.StatusOK:
			admitted++
			charged += ch.cost
			modes[ch.mode]++
		case http.StatusTooManyRequests:
			refused++
			refusedUnits += ch.cost
			charged += ch.cost
		default:
			failed++
			failedUnits += ch.cost
		}
	}
	t.Logf("%s: checks %d admitted, %d refused, %d failed; charges %d admitted %v, %d refused and counted (%d tokens), %d failed; %d tokens charged",
		p.Name, rec.checksAdmitted, rec.checksRefused, rec.checksFailed, admitted, modes, refused, refusedUnits, failed, charged)
	if rec.checksFailed > 0 || failed > 0 {
		t.Errorf("%s: %d checks and %d charges (%d tokens) failed; last check error %q", p.Name, rec.checksFailed, failed, failedUnits, rec.lastCheckErr)
		for _, ch := range rec.charges {
			if ch.status == 0 {
				t.Logf("failed charge in %s at %s: %s", ch.region, ch.sent.Format("15:04:05.000"), ch.err)
			}
		}
	}

	// Every decision was Redis's: the local fallback counts where neither
	// the Redis sums nor the bound computed here (no Redis outages) look.
	var overMetric float64
	for _, a := range c.Agents {
		m := postHocMetrics(t, web, a, p.Name)
		if fb := m[`quotalease_agent_decisions_total|mode="local-fallback"`] + m["quotalease_agent_fallback_after_timeout_total"]; fb > 0 {
			t.Errorf("%s in %s: %v decisions by the local fallback; the Redis accounting below cannot see them", p.Name, a.Region, fb)
		}
		overMetric += m["quotalease_agent_post_hoc_over_limit_units_total"]
	}

	// (a) Every token charged was counted. The refused charges' units are
	// what the agents counted over the limit...
	if overMetric != float64(refusedUnits) {
		t.Errorf("%s: the agents counted %v units charged over the limit, the client was refused charges of %d: %v tokens refused and not counted",
			p.Name, overMetric, refusedUnits, float64(refusedUnits)-overMetric)
	}
	// ... and Redis holds every charge, admitted or not.
	overLimit := "" // (c), below: where the identity was seen over its limit
	switch p.Algorithm {
	case policy.FixedWindow, policy.SlidingWindow:
		perWindow, err := poll.windowTotals(p, rec)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		var idx []int64
		var counted int64
		for n, v := range perWindow {
			idx = append(idx, n)
			counted += v
		}
		sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
		var parts []string
		over := 0
		for _, n := range idx {
			parts = append(parts, strconv.FormatInt(perWindow[n], 10))
			if float64(perWindow[n]) > p.Limit {
				over++
			}
			// A fixed window's counters are the exact count of every aligned
			// window as decided.
			if p.Algorithm == policy.FixedWindow && float64(perWindow[n]) > b.WorstCase {
				t.Errorf("%s: aligned window %d counted %d tokens in Redis, above the bound %.1f (%v)", p.Name, n, perWindow[n], b.WorstCase, b.Terms)
			}
		}
		t.Logf("%s: tokens counted per aligned window (Redis, both regions): %s; %d over the limit %v (the limit plus the post-hoc term: %v)",
			p.Name, strings.Join(parts, " "), over, p.Limit, p.Limit+b.Terms[bound.TermPostHoc])
		t.Logf("%s: Redis counted %d tokens in all, the client charged %d", p.Name, counted, charged)
		if counted != charged && (failed == 0 || counted != charged+failedUnits) {
			t.Errorf("%s: both regions' Redis counted %d tokens in all, the client charged %d (and %d more in failed charges): %d tokens not counted",
				p.Name, counted, charged, failedUnits, charged-counted)
		}
		if over > 0 {
			overLimit = fmt.Sprintf("%d windows counted more than the limit", over)
		}
	case policy.TokenBucket:
		// Redis's buckets hold no sum of what they were charged; that the
		// refused charges reached them shows as a debt.
		debt := poll.minTokens(p.Name)
		t.Logf("%s: deepest debt seen in Redis: %.1f tokens", p.Name, -float64(debt)/float64(policy.Micro))
		if refused > 0 && debt >= 0 {
			t.Errorf("%s: %d charges were refused and counted, yet no bucket in Redis was seen in debt", p.Name, refused)
		}
		if debt < 0 {
			overLimit = "a bucket went into debt"
		}
	}

	// (b) No window of the period holds more than the bound.
	period := time.Duration(p.Period)
	hi, hiEnd := postHocMaxWindow(rec.charges, period, true)
	lo, _ := postHocMaxWindow(rec.charges, period, false)
	t.Logf("%s: most tokens charged in a %v window: %d (at least %d); bound %.1f %v", p.Name, period, hi, lo, b.WorstCase, b.Terms)
	if float64(hi) > b.WorstCase {
		t.Errorf("%s: %d tokens charged (at least %d decided within it) in the %v window ending %s; the bound allows %.1f (%v)",
			p.Name, hi, lo, period, hiEnd.Format("15:04:05.000"), b.WorstCase, b.Terms)
	}

	// (c) The post-hoc term was exercised: charges that no longer fitted
	// were refused and counted, putting the identity over its limit.
	if refused == 0 || overMetric == 0 || overLimit == "" {
		t.Errorf("%s: %d charges refused, %v units counted over the limit by the agents, over the limit in Redis: %q: the post-hoc term was not exercised",
			p.Name, refused, overMetric, overLimit)
	}
	if rec.checksRefused == 0 || rec.checksAdmitted == 0 {
		t.Errorf("%s: checks %d admitted, %d refused: want both", p.Name, rec.checksAdmitted, rec.checksRefused)
	}
}

// postHocMaxWindow returns the most tokens charged in any window (a, a+w]
// and the window's end. A charge was decided at some instant within
// [sent, recv]: with upper, every charge that may have been decided in
// the window counts (failed ones too), so the count is at least what the
// system decided in it; else only those that surely were.
func postHocMaxWindow(charges []postHocCharge, w time.Duration, upper bool) (int64, time.Time) {
	var best int64
	var bestEnd time.Time
	for _, j := range charges {
		var a time.Time
		if upper {
			a = j.sent.Add(-w) // the window ending as j was sent
		} else {
			a = j.sent.Add(-time.Nanosecond) // the window starting as j was sent
		}
		var sum int64
		for _, i := range charges {
			if !upper && i.status == 0 {
				continue
			}
			var in bool
			if upper {
				in = !i.sent.After(a.Add(w)) && i.recv.After(a)
			} else {
				in = i.sent.After(a) && !i.recv.After(a.Add(w))
			}
			if in {
				sum += i.cost
			}
		}
		if sum > best {
			best, bestEnd = sum, a.Add(w)
		}
	}
	return best, bestEnd
}

// postHocMetrics reads a's metrics for policy pol: each series name, and
// the decisions by mode as `name|mode="..."`, summed over the other labels.
func postHocMetrics(t *testing.T, web *http.Client, a *AgentProcess, pol string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range scrape(t, web, a.HTTP+"/metrics") {
		if !strings.Contains(s.labels, `policy="`+pol+`"`) {
			continue
		}
		out[s.name] += s.value
		if i := strings.Index(s.labels, `mode="`); i >= 0 {
			j := strings.IndexByte(s.labels[i+6:], '"')
			out[s.name+"|"+s.labels[i:i+6+j+1]] += s.value
		}
	}
	return out
}

// postHocPoller reads one identity's keys in every region's Redis every
// 100 ms, with the Redis clock: fixed windows' counters, sliding windows'
// and token buckets' state. A counter lives a second past its window's
// end, and a final reading must come after the window settles, a slot a
// poll on a loaded machine can miss: the poller keeps every counter it
// reads for postHocKeep more (no decision reads a window's counter once
// the window has ended).
type postHocPoller struct {
	clients  []*redis.Client
	regions  []string
	identity string

	mu       sync.Mutex
	counters map[string]postHocSeen    // region/key of a window counter: its last reading
	states   map[string][]postHocState // region/policy: sliding window states, in order
	tokens   map[string]int64          // policy: the lowest token bucket level seen
	lastPoll []int64                   // per region: the Redis time a complete poll last began
	failure  error

	stop func() // ends run and waits for it (startPostHocPoller)
}

// postHocSeen is a reading of a fixed window's counter.
type postHocSeen struct {
	policy, region string
	window, value  int64
	atMs           int64 // the Redis time the poll began, before the reading
}

type postHocState struct {
	atMs       int64
	w, pv, cur int64
}

// startPostHocPoller starts polling identity's keys in c's Redis (run)
// until finish, or the test's end.
func startPostHocPoller(t *testing.T, c *Cluster, identity string) *postHocPoller {
	p := newPostHocPoller(c, identity)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	p.stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(p.stop)
	return p
}

// finish waits until p has polled after the window of period holding last
// (the last charge's answer) closed and its counters settled, stops p, and
// fails t if a poll failed: p's readings are then the windows' final
// counts in every region (the poller keeps each counter it reads).
func (p *postHocPoller) finish(t *testing.T, last time.Time, period time.Duration) {
	t.Helper()
	settledAt := (last.UnixMilli()/period.Milliseconds()+1)*period.Milliseconds() + postHocSettle.Milliseconds()
	testenv.WaitFor(t, 3*period+10*time.Second, "a Redis poll after the last window closed", func() bool {
		return p.polledSince(settledAt)
	})
	p.stop()
	if p.err() != nil {
		t.Fatalf("polling Redis: %v", p.err())
	}
}

func newPostHocPoller(c *Cluster, identity string) *postHocPoller {
	p := &postHocPoller{identity: identity, counters: map[string]postHocSeen{}, states: map[string][]postHocState{}, tokens: map[string]int64{}}
	for i, s := range c.Redis {
		p.clients = append(p.clients, redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1}))
		p.regions = append(p.regions, c.Opts.Regions[i])
	}
	p.lastPoll = make([]int64, len(p.clients))
	return p
}

func (p *postHocPoller) run(ctx context.Context) {
	defer func() {
		for _, cl := range p.clients {
			cl.Close()
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for i := range p.clients {
			if err := p.pollOnce(ctx, i); err != nil && ctx.Err() == nil {
				p.mu.Lock()
				p.failure = err
				p.mu.Unlock()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (p *postHocPoller) pollOnce(ctx context.Context, i int) error {
	cl, region := p.clients[i], p.regions[i]
	now, err := cl.Time(ctx).Result()
	if err != nil {
		return err
	}
	at := now.UnixMilli()
	keys, err := cl.Keys(ctx, "rl:{*:"+p.identity+"}:v*").Result()
	if err != nil {
		return err
	}
	for _, k := range keys {
		name, suffix, ok := postHocSplitKey(k, p.identity)
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(suffix, "w"):
			n, err := strconv.ParseInt(suffix[1:], 10, 64)
			if err != nil {
				continue
			}
			v, err := cl.Get(ctx, k).Int64()
			if err == redis.Nil {
				continue // expired meanwhile
			}
			if err != nil {
				return err
			}
			if err := cl.ExpireGT(ctx, k, postHocKeep).Err(); err != nil {
				return err
			}
			p.recordCounter(region, name, k, n, v, at)
		case suffix == "":
			h, err := cl.HGetAll(ctx, k).Result()
			if err != nil {
				return err
			}
			p.recordState(region, name, h, at)
		}
	}
	p.mu.Lock()
	p.lastPoll[i] = at
	p.mu.Unlock()
	return nil
}

// postHocSplitKey splits rl:{<policy>:<identity>}:v<version>[:<suffix>].
func postHocSplitKey(k, identity string) (name, suffix string, ok bool) {
	rest, ok := strings.CutPrefix(k, "rl:{")
	if !ok {
		return "", "", false
	}
	tag, after, ok := strings.Cut(rest, "}:v")
	if !ok {
		return "", "", false
	}
	name, ok = strings.CutSuffix(tag, ":"+identity)
	if !ok {
		return "", "", false
	}
	_, suffix, _ = strings.Cut(after, ":")
	return name, suffix, true
}

// recordCounter keeps the latest reading of a counter: made after its
// window closed and settled, it is the window's final count.
func (p *postHocPoller) recordCounter(region, name, key string, n, v, at int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counters[region+"/"+key] = postHocSeen{policy: name, region: region, window: n, value: v, atMs: at}
}

func (p *postHocPoller) recordState(region, name string, h map[string]string, at int64) {
	num := func(f string) (int64, bool) {
		v, err := strconv.ParseInt(h[f], 10, 64)
		return v, err == nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := num("t"); ok { // a token bucket
		if low, seen := p.tokens[name]; !seen || t < low {
			p.tokens[name] = t
		}
		return
	}
	w, ok1 := num("w")
	pv, ok2 := num("p")
	cur, ok3 := num("c")
	if ok1 && ok2 && ok3 {
		id := region + "/" + name
		p.states[id] = append(p.states[id], postHocState{atMs: at, w: w, pv: pv, cur: cur})
	}
}

func (p *postHocPoller) polledSince(ms int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failure != nil {
		return true
	}
	for _, at := range p.lastPoll {
		if at < ms {
			return false
		}
	}
	return true
}

func (p *postHocPoller) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failure
}

func (p *postHocPoller) minTokens(name string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tokens[name]
}

// windowTotals returns, for a fixed or sliding window policy, the tokens
// both regions' Redis counted in each window of the run (window index:
// Redis time ÷ period), from readings made once the window had closed. It
// is an error for a window the client may have charged in to have no
// final reading in a region where it charged.
func (p *postHocPoller) windowTotals(pol *policy.Policy, rec *postHocRecords) (map[int64]int64, error) {
	w := time.Duration(pol.Period).Milliseconds()
	p.mu.Lock()
	defer p.mu.Unlock()
	final := map[string]map[int64]int64{} // region: window: units
	for _, r := range p.regions {
		final[r] = map[int64]int64{}
	}
	switch pol.Algorithm {
	case policy.FixedWindow:
		// The poller keeps the last reading of each counter; it is final if
		// made once the window had closed and settled.
		for _, s := range p.counters {
			if s.policy != pol.Name {
				continue
			}
			if s.atMs >= (s.window+1)*w+postHocSettle.Milliseconds() {
				final[s.region][s.window] = s.value
			}
		}
	case policy.SlidingWindow:
		// A state in window n+1 holds window n's final count as its
		// previous one; a state still in window n read after its close
		// holds it as its count.
		for _, r := range p.regions {
			for _, s := range p.states[r+"/"+pol.Name] {
				if _, ok := final[r][s.w-1]; !ok {
					final[r][s.w-1] = s.pv
				}
				if s.atMs >= (s.w+1)*w+postHocSettle.Milliseconds() {
					final[r][s.w] = s.cur
				}
			}
		}
	}
	// Every window a region's charges may have fallen in has a final count.
	for _, ch := range rec.charges {
		for n := ch.sent.UnixMilli() / w; n <= ch.recv.UnixMilli()/w; n++ {
			if _, ok := final[ch.region][n]; !ok {
				return nil, fmt.Errorf("no final reading of %s's Redis for window %d, where the charge sent at %s may have counted; the poller fell behind",
					ch.region, n, ch.sent.Format("15:04:05.000"))
			}
		}
	}
	out := map[int64]int64{}
	for _, byWin := range final {
		for n, v := range byWin {
			if v%policy.Micro != 0 {
				return nil, fmt.Errorf("window %d counts %d micro-units, not whole tokens", n, v)
			}
			out[n] += v / policy.Micro
		}
	}
	return out, nil
}
