package agent

import (
	"context"
	"errors"
	"io"
	"maps"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// rawStream is an RLQS stream driven by hand: the messages it received
// arrive on got, the stream's end on ended.
type rawStream struct {
	s     rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	got   chan *rlqsv3.RateLimitQuotaResponse
	ended chan error
}

func openRaw(t *testing.T, addr string) *rawStream { return openRawOn(t, grpcConn(t, addr)) }

// openRawOn opens a rawStream on cc.
func openRawOn(t *testing.T, cc *grpc.ClientConn) *rawStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawStream{s: s, got: make(chan *rlqsv3.RateLimitQuotaResponse, 1000), ended: make(chan error, 1)}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				r.ended <- err
				return
			}
			r.got <- m
		}
	}()
	return r
}

// send sends one report. io.EOF means the agent has already ended the
// stream (a stream beyond its most is refused as it opens); gRPC reports
// the reason on Recv, so the caller reads it from ended.
func (r *rawStream) send(t *testing.T, domain string, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	t.Helper()
	err := r.s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us})
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}

// next waits for the next action on bucket (skipping others).
func (r *rawStream) next(t *testing.T, bucket map[string]string) (*rlqsv3.RateLimitQuotaResponse_BucketAction, time.Time) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-r.got:
			for _, a := range m.BucketAction {
				if maps.Equal(a.GetBucketId().GetBucket(), bucket) {
					return a, time.Now()
				}
			}
		case err := <-r.ended:
			t.Fatalf("stream ended: %v", err)
		case <-deadline:
			t.Fatalf("no action for %v", bucket)
		}
	}
}

// wantEnd waits for the agent to end r with code. It fails t, naming what
// was sent on the stream (what), if the stream ends otherwise or is still
// open after 5 s.
func (r *rawStream) wantEnd(t *testing.T, code codes.Code, what string) {
	t.Helper()
	select {
	case err := <-r.ended:
		if status.Code(err) != code {
			t.Fatalf("%s: the stream ended with %v, want %s", what, err, code)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: the stream did not end, want %s", what, code)
	}
}

// closeSend ends r from the client's side, as an Envoy instance going away
// does, and waits for the agent to end it too.
func (r *rawStream) closeSend(t *testing.T) {
	t.Helper()
	if err := r.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	<-r.ended
}

// edgeRefused counts the buckets a refused for reason
// (quotalease_agent_edge_buckets_refused_total).
func edgeRefused(t testing.TB, a *Agent, reason string) float64 {
	t.Helper()
	return counterValueLabeled(t, a, "quotalease_agent_edge_buckets_refused_total", "reason", reason)
}

func use(b map[string]string, elapsed time.Duration, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: b},
		TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

// Every assignment's time to live is whole seconds, at least one, and its
// life (delivery margin and drift included) ends before the region's grant
// does, over several renewals; the token bucket refills no faster than
// whole-second intervals allow Envoy to read.
func TestRLQSTTLWithinGrant(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy, fastEdge)
	r := openRaw(t, ra.grpcAddr)
	r.send(t, "shop", use(acme, 0, 1, 0))
	end := time.Now().Add(3 * time.Second) // past a renewal or two of the tests' 2 s leases
	n := 0
	for time.Now().Before(end) {
		r.send(t, "shop", use(acme, 0, 50, 50))
		a, at := r.next(t, acme)
		q := a.GetQuotaAssignmentAction()
		if q == nil {
			t.Fatalf("action %v, want an assignment", a)
		}
		ttl := q.GetAssignmentTimeToLive().AsDuration()
		if ttl < time.Second || ttl%time.Second != 0 {
			t.Fatalf("time to live %s: Envoy reads whole seconds, at least one", ttl)
		}
		until := ra.a.leaser.ValidUntil("api")
		if life := edge.Lifetime(ttl, ra.a.cfg.Drift, ra.a.cfg.Edge.Margin); at.Add(life).After(until.Add(ra.a.cfg.Edge.Margin)) {
			t.Fatalf("assignment received at %s lives %s, beyond the grant's end %s", at.Format("15:04:05.000"), life, until.Format("15:04:05.000"))
		}
		if tb := q.GetRateLimitStrategy().GetTokenBucket(); tb != nil {
			if iv := tb.GetFillInterval().AsDuration(); iv < time.Second || iv%time.Second != 0 || tb.GetTokensPerFill() == nil {
				t.Fatalf("token bucket %v: Envoy needs whole-second fill intervals and tokens per fill", tb)
			}
		}
		n++
		time.Sleep(50 * time.Millisecond)
	}
	if n < 4 {
		t.Fatalf("only %d assignments seen", n)
	}
}

// Bad input never ends a stream but for its domain, never panics, is
// counted by reason, and reserves nothing: unknown policies, bucket ids too
// large, lacking or beyond the policy's identity attributes, a policy
// without edge settings, more buckets or messages than a stream may send,
// absurd counts. A good bucket on the same stream still gets its
// assignment.
func TestRLQSBadInput(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy+"---\nname: plain\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n", func(c *Config) {
		fastEdge(c)
		c.Edge.MaxBucketsPerStream, c.Edge.ReportsPerSecond, c.Edge.ReportBurst = 4, 2, 30
	})
	refused := func(reason string) float64 { return edgeRefused(t, ra.a, reason) }

	r := openRaw(t, ra.grpcAddr)
	r.send(t, "", use(acme, 0, 1, 0))
	r.wantEnd(t, codes.InvalidArgument, "a first report without a domain")

	r = openRaw(t, ra.grpcAddr)
	big := map[string]string{"policy": "api"}
	for i := 0; i < rlqs.MaxBucketEntries; i++ {
		big["k"+strconv.Itoa(i)] = "v"
	}
	r.send(t, "shop",
		use(map[string]string{"policy": "nope", "tenant": "x"}, 0, 1, 0), // unknown policy
		use(big, 0, 1, 0), // too many entries
		use(map[string]string{"policy": "api"}, 0, 1, 0),                           // lacks the identity
		use(map[string]string{"policy": "api", "tenant": "x", "ip": "1"}, 0, 1, 0), // beyond it
		use(map[string]string{"policy": "plain", "tenant": "x"}, 0, 1, 0),          // no edge settings
		use(map[string]string{"tenant": "x"}, 0, 1, 0),                             // names no policy
		use(nil, 0, 1, 0), // no bucket id
		use(map[string]string{"policy": "api", "tenant": "x", "pad": strings.Repeat("v", 200<<10)}, 0, 1, 0), // a 200 KB value
	)
	testenv.WaitFor(t, 5*time.Second, "the refusals counted", func() bool {
		return refused("unknown-policy") == 1 && refused("invalid") == 6 && refused("no-edge") == 1
	})
	// The stream is still served: a good bucket gets its assignment, even
	// with a count no Envoy sends.
	r.send(t, "shop", use(acme, time.Second, math.MaxUint64, math.MaxUint64))
	if a, _ := r.next(t, acme); a.GetQuotaAssignmentAction() == nil {
		t.Fatalf("good bucket got %v", a)
	}
	// Buckets beyond the stream's cap are dropped and counted.
	for i := 0; i < 6; i++ {
		r.send(t, "shop", use(map[string]string{"policy": "api", "tenant": "t" + strconv.Itoa(i)}, 0, 1, 0))
	}
	testenv.WaitFor(t, 5*time.Second, "buckets beyond the cap counted", func() bool {
		return counterValueLabeled(t, ra.a, "quotalease_agent_edge_reports_limited_total", "reason", "buckets") >= 3
	})
	// Messages beyond the pace are dropped and counted.
	for i := 0; i < 60; i++ {
		r.send(t, "shop", use(acme, 0, 1, 0))
	}
	testenv.WaitFor(t, 5*time.Second, "messages beyond the pace counted", func() bool {
		return counterValueLabeled(t, ra.a, "quotalease_agent_edge_reports_limited_total", "reason", "rate") >= 20
	})
	// Another domain on the same stream ends it.
	r.send(t, "other", use(acme, 0, 1, 0))
	r.wantEnd(t, codes.InvalidArgument, "a second domain")
	// Nothing the refused buckets named was reserved.
	for id := range ra.a.edge.Load().Identities {
		if id.Policy != "api" || id.Identity == "x" {
			t.Errorf("a refused bucket got a key: %+v", id)
		}
	}
}

// The agent's own budgets hold whatever its callers open: a stream beyond
// its most is refused with ResourceExhausted, a bucket beyond the most of
// all streams together is ignored, each counted; a stream that ends gives
// its place and its buckets back.
func TestRLQSAgentBudgets(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy, func(c *Config) {
		fastEdge(c)
		c.Edge.MaxStreams, c.Edge.MaxBuckets = 2, 3
		c.Edge.MaxStreamsPerCaller, c.Edge.MaxBucketsPerCaller = 2, 3 // one caller may take all: the agent's own caps are tested
	})
	limited := func(reason string) float64 {
		return counterValueLabeled(t, ra.a, "quotalease_agent_edge_reports_limited_total", "reason", reason)
	}
	tenant := func(n string) map[string]string { return map[string]string{"policy": "api", "tenant": n} }
	first, second := openRaw(t, ra.grpcAddr), openRaw(t, ra.grpcAddr)
	first.send(t, "shop", use(tenant("a"), 0, 1, 0), use(tenant("b"), 0, 1, 0))
	first.next(t, tenant("b"))
	second.send(t, "shop", use(tenant("c"), 0, 1, 0), use(tenant("d"), 0, 1, 0))
	second.next(t, tenant("c"))
	testenv.WaitFor(t, 5*time.Second, "the fourth bucket ignored", func() bool { return limited("agent-buckets") >= 1 })

	third := openRaw(t, ra.grpcAddr)
	third.send(t, "shop", use(tenant("e"), 0, 1, 0))
	third.wantEnd(t, codes.ResourceExhausted, "a third stream, beyond the agent's most")
	if limited("streams") < 1 {
		t.Error("the refused stream was not counted")
	}

	first.closeSend(t)
	testenv.WaitFor(t, 5*time.Second, "the first stream's place freed", func() bool {
		l := ra.a.edge.Load()
		return l.Streams == 1 && l.Buckets == 1
	})
	again := openRaw(t, ra.grpcAddr)
	again.send(t, "shop", use(tenant("e"), 0, 1, 0))
	if a, _ := again.next(t, tenant("e")); a.GetQuotaAssignmentAction() == nil {
		t.Fatalf("a stream opened after one ended: %v, want an assignment", a)
	}
}

// One caller cannot take the agent's whole budget: over mutual TLS, each
// client certificate is a caller, whose streams beyond its most are
// refused with ResourceExhausted and whose buckets beyond its most are
// ignored, each counted, while a caller with another certificate is
// served.
func TestRLQSCallerBudgets(t *testing.T) {
	ra := regionAgent(t, edgeTestPolicy, func(c *Config) {
		fastEdge(c)
		c.Edge.MaxStreamsPerCaller, c.Edge.MaxBucketsPerCaller = 2, 3
	})
	as := tlsGRPC(t, ra)
	limited := func(reason string) float64 {
		return counterValueLabeled(t, ra.a, "quotalease_agent_edge_reports_limited_total", "reason", reason)
	}
	tenant := func(n string) map[string]string { return map[string]string{"policy": "api", "tenant": n} }

	greedy := as("greedy")
	one, two := openRawOn(t, greedy), openRawOn(t, greedy)
	one.send(t, "shop", use(tenant("a"), 0, 1, 0), use(tenant("b"), 0, 1, 0), use(tenant("c"), 0, 1, 0))
	one.next(t, tenant("c"))
	two.send(t, "shop", use(tenant("d"), 0, 1, 0))
	testenv.WaitFor(t, 5*time.Second, "the caller's fourth bucket ignored", func() bool { return limited("caller-buckets") >= 1 })
	three := openRawOn(t, greedy)
	three.send(t, "shop", use(tenant("e"), 0, 1, 0))
	three.wantEnd(t, codes.ResourceExhausted, "a third stream of one certificate, beyond its most")
	if limited("caller-streams") < 1 {
		t.Error("the refused stream was not counted")
	}

	other := openRawOn(t, as("other"))
	other.send(t, "shop", use(tenant("f"), 0, 1, 0))
	if a, _ := other.next(t, tenant("f")); a.GetQuotaAssignmentAction() == nil {
		t.Fatalf("another certificate's stream: %v, want an assignment", a)
	}
	if l := ra.a.edge.Load(); l.Streams != 3 || l.Buckets != 4 {
		t.Errorf("the agent holds %d streams and %d buckets, want 3 and 4", l.Streams, l.Buckets)
	}
}

// The edge term's promises hold whatever connects: a stream's second
// bucket id of one identity (another spelling of it) gets no assignment
// and is abandoned once,
// nor does an instance beyond the policy's edge instances (kept, without a
// place); each is counted, and a place freed by a stream that ends goes to
// the instance waiting for one.
func TestRLQSInstancesAndSpellings(t *testing.T) {
	ra := regionAgent(t, strings.Replace(edgeTestPolicy, "instances: 4", "instances: 2", 1), fastEdge)
	refused := func(reason string) float64 { return edgeRefused(t, ra.a, reason) }
	slots := func() (n, placed int) {
		for _, s := range ra.a.edge.Load().Identities { // the test serves one identity
			n, placed = n+s.Buckets, placed+s.Placed
		}
		return n, placed
	}
	a := map[string]string{"policy": "api", "tenant": "a"}
	alias := map[string]string{"generic_key": "api", "tenant": "a"}
	first := openRaw(t, ra.grpcAddr)
	first.send(t, "shop", use(a, 0, 1, 0))
	first.next(t, a)
	// The second spelling is abandoned, whatever Envoy held for it (an
	// assignment of an earlier stream, or its fallback), and refused again
	// when Envoy makes its bucket again.
	first.send(t, "shop", use(alias, 0, 1, 0))
	if got, _ := first.next(t, alias); got.GetAbandonAction() == nil {
		t.Fatalf("the second spelling of an identity the stream holds: %v, want it abandoned", got)
	}
	first.send(t, "shop", use(alias, 0, 1, 0))
	testenv.WaitFor(t, 5*time.Second, "the second spelling refused twice", func() bool { return refused("second-bucket") >= 2 })
	if n, _ := slots(); n != 1 {
		t.Fatalf("identity a has %d buckets after one stream reported two spellings of it, want 1", n)
	}

	second, third := openRaw(t, ra.grpcAddr), openRaw(t, ra.grpcAddr)
	second.send(t, "shop", use(a, 0, 1, 0))
	second.next(t, a)
	third.send(t, "shop", use(a, 0, 1, 0))
	testenv.WaitFor(t, 5*time.Second, "the third instance refused", func() bool { return refused("instances") >= 1 })
	if n, placed := slots(); n != 3 || placed != 2 {
		t.Fatalf("identity a has %d buckets, %d placed, with the policy's 2 instances: want 3, 2", n, placed)
	}

	first.closeSend(t)
	// The third instance gets the place at once: its first message since
	// it reported is the assignment.
	if got, _ := third.next(t, a); got.GetQuotaAssignmentAction() == nil {
		t.Fatalf("the third instance, once a place was free: %v, want an assignment", got)
	}
	if n, placed := slots(); n != 2 || placed != 2 {
		t.Fatalf("after the first stream ended: %d buckets, %d placed, want 2, 2", n, placed)
	}
	// The first stream's refused spelling went with it.
	if l := ra.a.edge.Load(); l.Buckets != 2 {
		t.Fatalf("the agent counts %d buckets after the first stream ended, want the other two streams' 2", l.Buckets)
	}
}

// Streams that came first from one host cannot keep a policy's instances
// from other hosts' Envoys: four streams from 127.0.0.1 take both places
// of an identity, then an Envoy on 127.0.0.2 reports it, and one of the
// first host's instances is abandoned so that it gets its assignment.
// Before, it waited for as long as the four streams lasted.
func TestRLQSPlacesSharedBetweenHosts(t *testing.T) {
	if l, err := net.Listen("tcp", "127.0.0.2:0"); err != nil {
		t.Skipf("this system has no loopback address but 127.0.0.1: %v", err)
	} else {
		l.Close()
	}
	ra := regionAgent(t, strings.Replace(edgeTestPolicy, "instances: 4", "instances: 2", 1), fastEdge)
	a := map[string]string{"policy": "api", "tenant": "a"}
	buckets := func() (n int) {
		for _, s := range ra.a.edge.Load().Identities {
			n += s.Buckets
		}
		return n
	}
	from := func(ip string) *rawStream {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		cc, err := grpc.NewClient(ra.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return openRawOn(t, cc)
	}
	var first []*rawStream
	for i := range 4 { // one after the other: the first two to report take the places
		st := from("127.0.0.1")
		st.send(t, "shop", use(a, 0, 1, 0))
		testenv.WaitFor(t, 5*time.Second, "the agent counting the stream's bucket", func() bool { return buckets() == i+1 })
		first = append(first, st)
	}
	first[0].next(t, a)
	first[1].next(t, a)
	testenv.WaitFor(t, 5*time.Second, "the first host's two instances beyond the places refused", func() bool {
		return edgeRefused(t, ra.a, "instances") >= 2
	})
	other := from("127.0.0.2")
	other.send(t, "shop", use(a, 0, 1, 0))
	if got, _ := other.next(t, a); got.GetQuotaAssignmentAction() == nil {
		t.Fatalf("another host's instance: %v, want an assignment", got)
	}
	if got, _ := first[1].next(t, a); got.GetAbandonAction() == nil {
		t.Fatalf("the first host's last placed instance: %v, want its bucket abandoned", got)
	}
}
