package rlqs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/testenv/edgescript"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// The agent's edge rounds send what the simulator's send: the scripted
// reports, stream ends, store outage and capacity moves of
// internal/testenv/edgescript go through the engine's RLQS side (report,
// open, close, its rounds as Run schedules them), on a manual clock, with
// the script's leases and a store in memory; every action sent must be the
// one recorded, which the simulator's test (sim TestEdgeRoundsAsTheAgent)
// checks its own against.
func TestEdgeRoundsAsTheSimulator(t *testing.T) {
	p := edgescript.Policy()
	var clk clock.Manual
	clk.Set(edgescript.Base)
	var set admission.PolicySet
	if err := set.Set([]*policy.Policy{p}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Tuning = edgescript.Tuning()
	e := New(Host{Clock: &clk, Logger: hclog.NewNullLogger(), Leases: noLeases{}, Policies: &set, Asked: &set, Envoy: func() checkapi.EnvoyIndex { return nil }},
		cfg, edgescript.Drift, prometheus.NewRegistry())
	leases := edgescript.NewLeases(p)
	store := &downStore{Store: edge.NewMemStore(func() int64 { return clk.Now().UnixMilli() }).Agent("us-1", "")}
	e.r = edge.NewRound(e.rc, compareSlots, leases, store, e)
	e.SetPolicies([]*policy.Policy{p})

	var rec edgescript.Record
	streams := map[int]*rlqsStream{} // by instance: its open stream
	instanceOf := map[*rlqsStream]int{}
	since := func() time.Duration { return clk.Now().Sub(time.UnixMilli(edgescript.Base)) }
	round := func() time.Duration {
		res := e.round(context.Background())
		for st, i := range instanceOf {
			for len(st.out) > 0 {
				for _, act := range (<-st.out).BucketAction {
					recordAction(&rec, since(), i, act)
				}
			}
		}
		return res.After(e.rc, clk.Now())
	}
	events := edgescript.Events()
	roundAt := e.cfg.Tick // run's first round
	for {
		at := roundAt
		if len(events) > 0 {
			at = min(at, events[0].At)
		}
		if at >= edgescript.End {
			break
		}
		clk.Set(edgescript.Base + at.Milliseconds())
		for len(events) > 0 && events[0].At == at {
			ev := events[0]
			events = events[1:]
			switch ev.Kind {
			case "report":
				st := streams[ev.Instance]
				if st == nil {
					var err error
					if st, err = e.open(false, fmt.Sprint("instance ", ev.Instance), fmt.Sprint("instance ", ev.Instance)); err != nil {
						t.Fatal(err)
					}
					streams[ev.Instance], instanceOf[st] = st, ev.Instance
				}
				m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
					BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"policy": p.Name, "tenant": ev.Tenant}},
					TimeElapsed: durationpb.New(ev.Elapsed), NumRequestsAllowed: ev.Allowed, NumRequestsDenied: ev.Denied}}}
				if err := e.report(st, m); err != nil {
					t.Fatal(err)
				}
			case "close":
				st := streams[ev.Instance]
				e.close(st)
				delete(streams, ev.Instance)
				delete(instanceOf, st)
			case "down", "up":
				store.set(ev.Kind == "down")
			case "capacity":
				leases.Apply(ev)
			}
		}
		select {
		case <-e.kick: // as run: a kick runs a round at once
			roundAt = at
		default:
		}
		for roundAt == at {
			roundAt = at + round().Truncate(time.Millisecond) // the manual clock reads whole ms, as the simulation
		}
	}
	if err := edgescript.Check(&rec); err != nil {
		t.Fatal(err)
	}
}

// recordAction records an action the agent sent on a stream.
func recordAction(rec *edgescript.Record, at time.Duration, instance int, act *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	tenant := act.GetBucketId().GetBucket()["tenant"]
	if act.GetAbandonAction() != nil {
		rec.Add(at, instance, tenant, true, tokens.Bucket{}, 0)
		return
	}
	qa := act.GetQuotaAssignmentAction()
	var b tokens.Bucket
	if tb := qa.GetRateLimitStrategy().GetTokenBucket(); tb != nil {
		b = tokens.Bucket{MaxTokens: tb.GetMaxTokens(), TokensPerFill: tb.GetTokensPerFill().GetValue(), FillInterval: tb.GetFillInterval().AsDuration()}
	}
	rec.Add(at, instance, tenant, false, b, qa.GetAssignmentTimeToLive().AsDuration())
}

// noLeases is an agent's leases that hold nothing and note nothing: the
// rounds ask the script's leases instead.
type noLeases struct{}

func (noLeases) Succession() (nonce, predecessor string)                                      { return "", "" }
func (noLeases) ValidUntil(string) time.Time                                                  { return time.Time{} }
func (noLeases) EnforceAt(string, string, time.Time) (int64, lease.Mode)                      { return 0, lease.ModeLeased }
func (noLeases) Observe(name, identity string, cost int64, span time.Duration, now time.Time) {}

// downStore is a store that fails while down.
type downStore struct {
	edge.Store
	mu   sync.Mutex
	down bool
}

func (s *downStore) set(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

func (s *downStore) Sync(ctx context.Context, ws []edge.Write, read bool, alive time.Duration) (edge.SyncAnswer, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return edge.SyncAnswer{}, errors.New("the store is down")
	}
	return s.Store.Sync(ctx, ws, read, alive)
}
