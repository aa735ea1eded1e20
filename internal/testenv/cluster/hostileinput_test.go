package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
)

// Envoy-like callers holding the service certificate send, on 10 streams,
// 20 messages a second each naming one new bucket whose tenant value is
// 200 KB, for 6 s: 240 MB of bucket ids. The agent keeps what it serves
// whole, so it refuses such ids before keeping anything (the previous
// code kept every one as key and id: 25 MB to 3.2 GB of RSS in 17 s). It
// counts them, stays ready and small, and still assigns an honest bucket.
func TestRLQSLargeValuesOverRealProcesses(t *testing.T) {
	testenv.SkipMultiProcess(t)
	// Leases of 10 s: a grant outlives the honest bucket's assignment.
	c := startWith(t, floodPolicy, Options{Regions: []string{"us"}, Coordinators: 1, LeaseDuration: 10 * time.Second})
	agent := c.Agents[0]
	ctx := t.Context()
	if err := agent.WaitKnows(ctx, floodPolicy); err != nil {
		t.Fatal(err)
	}
	waitLeased(t, agent, "api", "tenant", 30*time.Second)
	rq := rlqsv3.NewRateLimitQuotaServiceClient(dial(t, agent.Addr, c.pki.service))
	before := procStatus(t, agent.Pid(), "VmRSS") / 1024
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // an agent that stops answering fails the test
	defer cancel()

	notReady := make(chan int, 1)
	probe, stopProbe := context.WithCancel(ctx)
	go func() { notReady <- pollReady(probe, agent) }()
	const streams, perSecond, seconds, valueBytes = 10, 20, 6, 200 << 10
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	pad := strings.Repeat("v", valueBytes)
	for s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- sendReports(ctx, rq, perSecond*seconds, time.Second/perSecond, func(i int) *rlqsv3.RateLimitQuotaUsageReports {
				return usageOf("shop", &rlqsv3.BucketId{Bucket: map[string]string{"policy": "api", "tenant": fmt.Sprintf("%d-%d-%s", s, i, pad)}})
			})
		}()
	}
	wg.Wait()
	stopProbe()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The agent may still be reading the last messages sent.
	const sent = streams * perSecond * seconds
	var refused, paced float64
	poll(t, 30*time.Second, 100*time.Millisecond, func() error {
		refused = scrapeMetric(t, agent, `quotalease_agent_edge_buckets_refused_total{reason="invalid"}`)
		paced = scrapeMetric(t, agent, `quotalease_agent_edge_reports_limited_total{reason="rate"}`)
		if refused+paced < sent {
			return fmt.Errorf("%.0f of the %d messages sent refused or dropped so far", refused+paced, sent)
		}
		return nil
	})
	after := procStatus(t, agent.Pid(), "VmRSS") / 1024
	t.Logf("%d streams x %d messages of a %d KB value: %.0f buckets refused as invalid, %.0f messages beyond the pace; agent RSS %d -> %d MB",
		streams, perSecond*seconds, valueBytes>>10, refused, paced, before, after)
	if after >= 512 {
		t.Errorf("agent RSS %d MB after the flood of large values, want under 512", after)
	}
	if refused+paced != sent || refused < sent/2 {
		t.Errorf("%.0f bucket ids refused as invalid and %.0f messages dropped beyond the pace, of %d sent; want every one refused, nearly all as invalid", refused, paced, sent)
	}
	if k := <-notReady; k > 0 {
		t.Errorf("the agent was not ready %d times during the flood", k)
	}

	// An honest bucket on a new stream still gets its assignment.
	st, err := rq.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	honest := &rlqsv3.BucketId{Bucket: map[string]string{"policy": "api", "tenant": "honest"}}
	if err := st.Send(usageOf("shop", honest)); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("an honest bucket after the flood: %v", err)
	}
	if len(resp.GetBucketAction()) == 0 {
		t.Fatalf("an honest bucket after the flood got an empty message, want an assignment")
	}
	for _, a := range resp.GetBucketAction() {
		if a.GetQuotaAssignmentAction() == nil {
			t.Errorf("an honest bucket after the flood got %v, want an assignment", a)
		}
	}
}

// sendReports opens a stream of rq and sends message(i) for i from 0 to
// n-1, one every gap, draining what the agent answers; it returns once it
// closed its side and the agent ended the stream, or ctx ended.
func sendReports(ctx context.Context, rq rlqsv3.RateLimitQuotaServiceClient, n int, gap time.Duration,
	message func(i int) *rlqsv3.RateLimitQuotaUsageReports) error {
	st, err := rq.StreamRateLimitQuotas(ctx)
	if err != nil {
		return err
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	defer func() { <-drained }()
	tick := time.NewTicker(gap)
	defer tick.Stop()
	for i := range n {
		if err := st.Send(message(i)); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return st.CloseSend()
}

// usageOf is a usage report of one request allowed in bucket id, as
// Envoy's first report of a new bucket is.
func usageOf(domain string, id *rlqsv3.BucketId) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: id, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1}}}
}

// Four Envoy-like clients per region report one identity under two
// bucket ids (policy: shared, and generic_key: shared as a descriptor's
// default key spells it), both at twice the limit, then lose their streams
// for longer than an assignment lives and reconnect. Each instance holds
// one bucket of the identity, as the bound's edge term counts: never two
// of its spellings with an assignment or a fallback at once (sampled every
// 20 ms from the clients' caches), whichever spelling a reconnected stream
// reports first. (Before, a stream that heard the other spelling first
// left the one served before running its expired assignment's fallback
// beside the new assignment.) Every window stays within the published
// bound, counted from the clients' own records.
func TestEdgeOneBucketPerIdentity(t *testing.T) {
	testenv.SkipMultiProcess(t)
	regions := []string{"us", "eu"}
	c, p, edges := edgeFleet(t, sybilPolicy, Options{Regions: regions, Coordinators: 1, LeaseDuration: 10 * time.Second}, "shared", 4, regions...)
	spellings := []map[string]string{{"policy": "shared", "api": "all"}, {"generic_key": "shared", "api": "all"}}
	_, stopTraffic := driveLoad(t, EdgeLoad{Demand: func(string, int, time.Duration) []EdgeDemand {
		return []EdgeDemand{{Bucket: spellings[0], Rate: 25}, {Bucket: spellings[1], Rate: 25}}
	}}, edges...)
	sampling, stopSampling := context.WithCancel(t.Context())
	sampled := make(chan struct{})
	var twice []string // what the sampler saw: an instance holding both spellings
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
			for _, e := range edges {
				for _, in := range e.Instances(0) {
					if held := heldSpellings(in, spellings); len(held) > 1 && len(twice) < 10 {
						twice = append(twice, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), in.Name(), held))
					}
				}
			}
		}
	}()
	finish := sync.OnceFunc(func() { stopSampling(); <-sampled; stopTraffic() })
	defer finish()

	allHold := func(what string) {
		testenv.WaitFor(t, 30*time.Second, what, func() bool {
			for _, e := range edges {
				for _, in := range e.Instances(0) {
					if !assigned(in, spellings[0]) && !assigned(in, spellings[1]) {
						return false
					}
				}
			}
			return true
		})
	}
	allHold("every instance assigned one spelling")
	for _, a := range c.Agents {
		testenv.WaitFor(t, 10*time.Second, "the second spelling refused on "+a.Region, func() bool {
			return scrapeMetric(t, a, `quotalease_agent_edge_buckets_refused_total{reason="second-bucket"}`) >= 1
		})
	}
	time.Sleep(2 * time.Second) // traffic under assignments
	cutStreams(true, edges...)
	time.Sleep(3 * time.Second) // past the assignments' life (ttl 1s): the fallbacks run
	cutStreams(false, edges...)
	allHold("every instance assigned one spelling after reconnecting")
	time.Sleep(time.Second)
	finish()

	for _, s := range twice {
		t.Errorf("an instance held two spellings of one identity (assigned or falling back) at once: %s", s)
	}
	dep := edgeDeployment(c)
	checkPublished(t, c, p, dep)
	checkWindows(t, admissions(edges), p, dep, time.Second, 0)
}

// heldSpellings lists the spellings in holds an assignment or an expired
// assignment's fallback for.
func heldSpellings(in *rlqsenvoy.Instance, spellings []map[string]string) []string {
	var held []string
	for _, b := range spellings {
		if st, ok := in.State(b); ok && st.Strategy != nil {
			held = append(held, fmt.Sprintf("%v (assigned %t)", b, st.Assigned))
		}
	}
	return held
}

// Five honest Envoy-like clients use one identity at twice its limit,
// then 100 streams of the same caller open and report its bucket at a
// million requests a second each, for 9 s. Those beyond the policy's
// 20 instances get no place, and an instance's share is split max-min
// fair among those that have one, so the inflated reports take what the
// honest instances leave, never their equal part: the honest clients
// keep at least 60% of 5/20 of the limit (before, 100 such streams drove
// them to none within 10 s), and every window stays within the published
// bound, counted from the honest clients' own records.
func TestEdgeSybilStreamsLeaveHonestInstances(t *testing.T) {
	testenv.SkipMultiProcess(t)
	yaml := strings.Replace(sybilPolicy, "instances: 4", "instances: 20", 1)
	c, p, edges := edgeFleet(t, yaml, Options{Regions: []string{"us"}, Coordinators: 1, LeaseDuration: 10 * time.Second}, "shared", 5, "us")
	bucket := map[string]string{"policy": "shared", "api": "all"}
	_, stop := drive(t, bucket, 40, edges...)
	defer stop()
	// admittedSince is the honest clients' admissions a second since from.
	admittedSince := func(from time.Time) float64 {
		n := 0
		for _, a := range admissions(edges) {
			if !a.At.Before(from) {
				n++
			}
		}
		return float64(n) / time.Since(from).Seconds()
	}
	poll(t, 30*time.Second, 200*time.Millisecond, func() error {
		if r := admittedSince(time.Now().Add(-time.Second)); r < 0.8*p.Limit {
			return fmt.Errorf("the honest clients admit %.0f/s, waiting for 80%% of the limit", r)
		}
		return nil
	})
	before := admittedSince(time.Now().Add(-time.Second))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rq := rlqsv3.NewRateLimitQuotaServiceClient(dial(t, c.Agents[0].Addr, c.pki.service))
	const sybils = 100
	inflated := func(int) *rlqsv3.RateLimitQuotaUsageReports {
		u := usageOf("shared", &rlqsv3.BucketId{Bucket: bucket})
		u.BucketQuotaUsages[0].NumRequestsAllowed = 1_000_000
		u.BucketQuotaUsages[0].TimeElapsed = durationpb.New(time.Second)
		return u
	}
	var wg sync.WaitGroup
	early := make(chan error, sybils) // a stream that ended before the attack did
	for range sybils {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sendReports(ctx, rq, 9, time.Second, inflated); err != nil && ctx.Err() == nil {
				early <- err
			}
		}()
	}
	time.Sleep(3 * time.Second) // the inflated reports reach the shares
	from := time.Now()
	time.Sleep(4 * time.Second)
	during := admittedSince(from)
	cancel()
	wg.Wait()
	stop()
	close(early)
	for err := range early {
		t.Errorf("an inflating stream ended before the attack did: %v", err)
	}

	equal := p.Limit * 5 / float64(p.Edge.Instances)
	t.Logf("honest clients admitted %.1f/s before the %d inflated streams, %.1f/s during (their equal part %.1f/s)", before, sybils, during, equal)
	if during < 0.6*equal {
		t.Errorf("the honest clients admitted %.1f/s under %d streams of inflated reports, want at least 60%% of their equal part %.1f/s", during, sybils, equal)
	}
	dep := edgeDeployment(c)
	checkPublished(t, c, p, dep)
	checkWindows(t, admissions(edges), p, dep, time.Second, 0)
}
