package rlqs

import (
	"errors"
	"io"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/quotalease"
)

// Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas):
// one stream per Envoy instance and domain. Envoy reports usage per bucket
// (at a bucket's first request, then every reporting interval); the agent
// maps each bucket to a policy identity (matchBucket), measures its demand
// from the reports, and pushes token-bucket assignments from the edge
// engine's rounds (Engine). The stream only translates; what to assign
// is the engine's.
//
// Bad input never ends the stream but for the domain: a stream whose
// first message names none, or that later names another, ends with
// InvalidArgument. A bucket that names nothing (bad id, unknown policy, a
// policy without edge settings) gets no assignment, counted by reason in
// quotalease_agent_edge_buckets_refused_total and logged at most every 30s;
// Envoy then follows its no_assignment_behavior. A bucket an
// envoyproxy/ratelimit configuration's domain does not limit (no match,
// unlimited) is assigned ALLOW_ALL, as the RLS answers OK. Messages beyond
// the stream's pace and buckets beyond its cap are dropped and counted
// (quotalease_agent_edge_reports_limited_total).
type rlqsServer struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	e *Engine
}

// Register adds Envoy's Rate Limit Quota Service, served by e, to s.
func (e *Engine) Register(s *grpc.Server) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(s, &rlqsServer{e: e})
}

// maxReportedRequests caps the requests one report may claim per bucket
// and result (a billion: more than any Envoy serves in a reporting
// interval), so that no report overflows the demand.
const maxReportedRequests = 1_000_000_000

// errDraining ends the RLQS streams of an agent that is shutting down
// (Engine.EndStreams).
var errDraining = status.Error(codes.Unavailable,
	"this agent is shutting down: reopen the stream to another agent of the region, or to this one once it "+
		"is back")

func (s *rlqsServer) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	select {
	case <-s.e.draining:
		return errDraining
	default:
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	caller := callerOf(stream.Context())
	st, err := s.e.open(len(md.Get(quotalease.ClientMetadata)) > 0, caller, groupOf(stream.Context(), caller))
	if err != nil {
		return err
	}
	defer s.e.close(st)
	failed := make(chan error, 2)
	go func() {
		for {
			select {
			case <-st.done:
				return
			case m := <-st.out:
				if err := stream.Send(m); err != nil {
					failed <- err
					return
				}
			}
		}
	}()
	go func() { failed <- s.receive(stream, st) }()
	select {
	case err := <-failed:
		return err
	case <-s.e.draining:
		return errDraining
	}
}

// receive takes the stream's usage reports until it ends (nil when Envoy
// closed it) or a report is refused.
func (s *rlqsServer) receive(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, st *rlqsStream) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.e.report(st, m); err != nil {
			return err
		}
	}
}

// open registers a new stream of caller, in group (groupOf), of the client
// library or of an Envoy, or refuses it beyond the agent's or the caller's
// budget.
func (e *Engine) open(library bool, caller, group string) (*rlqsStream, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.streams) >= e.cfg.MaxStreams {
		e.m.limited.WithLabelValues("streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted,
			"this agent serves %d RLQS streams, its most (--edge-max-streams): connect to another agent of the "+
				"region, or retry", e.cfg.MaxStreams)
	}
	cl := e.callers[caller]
	if cl == nil {
		cl = &callerLoad{name: caller}
		e.callers[caller] = cl
	}
	if cl.streams >= e.cfg.callerStreams() {
		e.m.limited.WithLabelValues("caller-streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted,
			"this caller (%s) holds %d RLQS streams on this agent, the most one caller may "+
				"(--edge-max-streams-per-caller): close some, or give other Envoys their own certificate",
			caller, cl.streams)
	}
	cl.streams++
	e.nextStream++
	st := &rlqsStream{id: e.nextStream, library: library, caller: cl, group: group,
		out: make(chan *rlqsv3.RateLimitQuotaResponse, rlqsOutbox), done: make(chan struct{}),
		slots: map[string]*rlqsSlot{}, allowAll: map[string]time.Time{}, second: map[string]bool{},
		tokens: float64(e.cfg.ReportBurst), tokensAt: e.h.Clock.Now(),
		refused: logs.Outage{What: "RLQS buckets refused", Interval: 30 * time.Second, Level: hclog.Warn}}
	e.streams[st.id] = st
	return st, nil
}

// close forgets a stream that ended; what its buckets were assigned keeps
// counting until it expires (the Envoy instance enforces it meanwhile, and
// may reconnect to any agent of the region).
func (e *Engine) close(st *rlqsStream) {
	e.mu.Lock()
	defer e.mu.Unlock()
	close(st.done)
	for bk, s := range st.slots {
		e.dropSlot(rlqsSlotID{st.id, bk}, s)
	}
	e.countBuckets(st, -len(st.allowAll)-len(st.second))
	delete(e.streams, st.id)
	st.caller.streams--
	if st.caller.streams == 0 { // its buckets went with its streams
		delete(e.callers, st.caller.name)
	}
}

// report takes one usage report. An error ends the stream.
func (e *Engine) report(st *rlqsStream, m *rlqsv3.RateLimitQuotaUsageReports) error {
	now := e.h.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-st.done: // the stream ended (the agent drains) as this report came
		return status.Error(codes.Unavailable, "the stream ended")
	default:
	}
	switch {
	case st.domain == "" && m.Domain == "":
		return status.Error(codes.InvalidArgument, "the first usage report must name a domain")
	case st.domain == "":
		if len(m.Domain) > policy.MaxAttributeValueBytes {
			return status.Errorf(codes.InvalidArgument, "domain of %d bytes, more than %d",
				len(m.Domain), policy.MaxAttributeValueBytes)
		}
		st.domain = m.Domain
	case m.Domain != "" && m.Domain != st.domain:
		return status.Errorf(codes.InvalidArgument,
			"the stream's domain is %s, a report names %s: one stream serves one domain",
			policy.QuoteName(st.domain), policy.QuoteName(m.Domain))
	}
	if !st.paced(now, e.cfg) {
		e.m.limited.WithLabelValues("rate").Inc()
		return nil
	}
	fresh := false
	for _, u := range m.BucketQuotaUsages {
		b := u.GetBucketId().GetBucket()
		if err := boundedBucket(b); err != nil { // before its key is built, kept or logged
			e.m.refused.WithLabelValues(refusedReason(err)).Inc()
			st.refused.Failed(e.h.Logger, now, "domain", st.domain, "error", err)
			continue
		}
		bk := quotalease.Key(b)
		s := st.slots[bk]
		if s == nil {
			if t, ok := st.allowAll[bk]; ok {
				if now.Sub(t) >= allowAllTTL/2 {
					st.allowAll[bk] = now
					st.pend = append(st.pend, allowAllAction(u.BucketId))
					fresh = true
				}
				continue
			}
			if !st.second[bk] && !e.roomFor(st) { // a second spelling is counted already
				continue
			}
			if s = e.subscribe(st, u.BucketId, bk, now); s == nil {
				fresh = fresh || len(st.pend) > 0
				continue
			}
			fresh = true
		}
		pol := s.key.Policy()
		if pol == nil {
			continue
		}
		e.m.reported.WithLabelValues(pol.Name, "allowed").Add(float64(u.NumRequestsAllowed))
		e.m.reported.WithLabelValues(pol.Name, "denied").Add(float64(u.NumRequestsDenied))
		count := min(u.NumRequestsAllowed, maxReportedRequests) + min(u.NumRequestsDenied, maxReportedRequests)
		// The edge's demand is the region's demand too: the lease asks for
		// it as for direct checks' (the meter), over the span the report
		// covers, so the region's share follows the edge.
		span := s.Report(pol, count, u.GetTimeElapsed().AsDuration(), now)
		e.h.Leases.Observe(pol.Name, s.key.ID.Identity, edge.ReportedCost(pol, count), span, now)
		s.key.Touch()
	}
	if fresh {
		e.kickSoon()
	}
	return nil
}

// subscribe maps a new bucket to what it names: a slot of a policy
// identity (returned), ALLOW_ALL for a bucket nothing limits, or a refusal
// counted by reason. e.mu is held.
func (e *Engine) subscribe(st *rlqsStream, id *rlqsv3.BucketId, bk string, now time.Time) *rlqsSlot {
	m, err := matchBucket(e.h.Envoy(), e.h.Asked, st.domain, id.GetBucket())
	var identity string
	if err == nil && m.pol != nil {
		switch {
		case m.pol.Edge == nil || m.pol.Scope != policy.ScopeGlobal:
			err = errNoEdge
		default:
			identity, err = m.pol.IdentityOf(m.attrs)
		}
	}
	if err != nil {
		e.m.refused.WithLabelValues(refusedReason(err)).Inc()
		st.refused.Failed(e.h.Logger, now, "domain", st.domain, "bucket", bk, "error", err)
		return nil
	}
	if m.pol == nil {
		e.unrefuse(st, bk)
		st.allowAll[bk] = now
		e.countBuckets(st, 1)
		st.pend = append(st.pend, allowAllAction(id))
		e.m.refused.WithLabelValues("unlimited").Inc()
		return nil
	}
	kid := edge.ID{Policy: m.pol.Name, Identity: identity}
	k := e.r.Lookup(kid)
	switch {
	case k == nil && e.r.Len() >= e.cfg.MaxIdentities:
		e.m.limited.WithLabelValues("identities").Inc()
		return nil
	case k != nil && onStream(k, st.id):
		err = errSecondBucket
		e.refuseSecond(st, id, bk)
	}
	if err != nil {
		e.m.refused.WithLabelValues(refusedReason(err)).Inc()
		st.refused.Failed(e.h.Logger, now, "domain", st.domain, "bucket", bk, "policy", m.pol.Name, "error", err)
		return nil
	}
	e.unrefuse(st, bk) // the spelling it lost to is gone: this one holds now
	k = e.r.Key(kid, m.pol)
	sid := rlqsSlotID{st.id, bk}
	s := &rlqsSlot{Slot: k.Add(sid, now), st: st, id: id, key: k}
	s.Group = st.group
	st.slots[bk] = s
	e.countBuckets(st, 1)
	return s
}

// refuseSecond abandons bucket bk the first time stream st reports it as
// another spelling of an identity the stream holds, and remembers it (one
// of the stream's buckets): whatever Envoy holds for it, an assignment of
// an earlier stream on which it was the spelling served or that
// assignment's expired fallback, goes, so that the instance runs one
// fallback of the identity whichever spelling a new stream hears of
// first. Its later reports are refused without an abandon, which would
// only make Envoy report it again as a new bucket at each request. e.mu is
// held.
func (e *Engine) refuseSecond(st *rlqsStream, id *rlqsv3.BucketId, bk string) {
	if st.second[bk] {
		return
	}
	st.second[bk] = true
	e.countBuckets(st, 1)
	st.pend = append(st.pend, abandonAction(id))
}

// unrefuse forgets that stream st refused bucket bk as a second spelling:
// it is served now, or names something else. e.mu is held.
func (e *Engine) unrefuse(st *rlqsStream, bk string) {
	if st.second[bk] {
		delete(st.second, bk)
		e.countBuckets(st, -1)
	}
}

// roomFor reports whether stream st may hold one more bucket, within its
// own, its caller's and the agent's caps, and counts the refusal if not.
// e.mu is held.
func (e *Engine) roomFor(st *rlqsStream) bool {
	switch {
	case len(st.slots)+len(st.allowAll)+len(st.second) >= e.cfg.MaxBucketsPerStream:
		e.m.limited.WithLabelValues("buckets").Inc()
	case e.buckets >= e.cfg.MaxBuckets:
		e.m.limited.WithLabelValues("agent-buckets").Inc()
	case st.caller.buckets >= e.cfg.callerBuckets():
		e.m.limited.WithLabelValues("caller-buckets").Inc()
	default:
		return true
	}
	return false
}

// onStream reports whether stream already holds a bucket of k: one
// instance gets one bucket of an identity, whatever spelling of it its
// bucket ids use, as the bound's edge term counts one fallback each.
func onStream(k *edgeKey, stream uint64) bool {
	for sid := range k.Slots {
		if sid.stream == stream {
			return true
		}
	}
	return false
}
