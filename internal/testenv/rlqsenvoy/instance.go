package rlqsenvoy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge/envoy"
	"github.com/quota-lease/quota-lease/quotalease"
)

// EnvoyReportInterval is the report period of Envoy's filter: hard-coded,
// whatever the buckets' reporting_interval says (filter_persistence.cc).
const EnvoyReportInterval = 5 * time.Second

// Config configures one Envoy-like instance.
type Config struct {
	// Name identifies the instance in records and errors.
	Name string
	// Target is the RLQS server's gRPC target (grpc.NewClient); the
	// instance owns the connection. Several addresses behind a resolver
	// play an Envoy cluster with several hosts.
	Target string
	// DialOptions are passed to grpc.NewClient (credentials at least).
	DialOptions []grpc.DialOption
	// InitialMetadata is sent with the stream, as the filter's
	// rlqs_server.initial_metadata.
	InitialMetadata metadata.MD
	// Domain is the filter's domain, sent in every report.
	Domain string
	// Settings are the RateLimitQuotaBucketSettings every bucket of this
	// instance was matched with; nil is Envoy with none of the optional
	// settings (allow all until assigned, no expired behaviour, 429).
	Settings *rlqfv3.RateLimitQuotaBucketSettings
	// ReportInterval is the report timer's period (Envoy: 5 s; tests
	// use shorter).
	ReportInterval time.Duration
	// Clock is read for decisions, token buckets, deadlines, report
	// times and records.
	Clock clock.Clock
	// SendQueue bounds the reports waiting to be written, as Envoy's
	// stream buffer would; beyond it they are dropped (and counted).
	SendQueue int
}

// DefaultConfig is an instance with Envoy's report interval on the system
// clock; Name, Target, DialOptions and Domain are for the caller.
func DefaultConfig() Config {
	return Config{ReportInterval: EnvoyReportInterval, Clock: clock.System(), SendQueue: 1024}
}

// Validate reports every bad setting.
func (c Config) Validate() error {
	var errs []error
	if c.Target == "" {
		errs = append(errs, errors.New("target is empty"))
	}
	if c.Domain == "" {
		errs = append(errs, errors.New("domain is empty (Envoy requires one)"))
	}
	if c.ReportInterval <= 0 {
		errs = append(errs, fmt.Errorf("report interval %v is not positive", c.ReportInterval))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock is nil"))
	}
	if c.SendQueue <= 0 {
		errs = append(errs, fmt.Errorf("send queue %d is not positive", c.SendQueue))
	}
	if _, err := parseSettings(c.Settings); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Decision is the filter's answer to one request.
type Decision struct {
	Allowed bool
	// Status is the HTTP status of the local reply when denied
	// (deny_response_settings, 429 by default); 0 when allowed.
	Status int
}

// Stats are an instance's counters.
type Stats = quotalease.Stats

// Instance is one Envoy: the quota-lease client library configured with
// Envoy's settings and behaviours (its report interval, a stream reopened
// only with the next report, buckets kept until abandoned), and its own
// records.
type Instance struct {
	cfg Config
	set *settings
	c   *quotalease.Client

	mu      sync.Mutex
	records map[string]*record
}

// New starts an instance. It opens its stream with its first bucket, as
// Envoy does, and runs until ctx ends or Close.
func New(ctx context.Context, cfg Config) (*Instance, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("envoy %q: %w", cfg.Name, err)
	}
	set, _ := parseSettings(cfg.Settings)
	c, err := quotalease.New(ctx, quotalease.Config{
		Target: cfg.Target, DialOptions: cfg.DialOptions, Metadata: cfg.InitialMetadata, Anonymous: true,
		Domain: cfg.Domain, Buckets: set.model,
		ReportInterval: cfg.ReportInterval, ReconnectWithReport: true, WholeSeconds: true, ForgetAfter: -1,
		SendQueue: cfg.SendQueue, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("envoy %q: %w", cfg.Name, err)
	}
	return &Instance{cfg: cfg, set: set, c: c, records: map[string]*record{}}, nil
}

// Name is the instance's name.
func (in *Instance) Name() string { return in.cfg.Name }

// Close stops the instance: its stream, its goroutines, its connection.
func (in *Instance) Close() error { return in.c.Close() }

// Allow decides one request matched into the bucket id (a BucketId map, as
// Envoy's bucket_id_builder would build it) and records it. It never
// blocks on the network.
func (in *Instance) Allow(id map[string]string) Decision {
	allowed := in.c.Allow(id)
	wall := in.cfg.Clock.Now()
	k := quotalease.Key(id)
	in.mu.Lock()
	defer in.mu.Unlock()
	r := in.records[k]
	if r == nil {
		r = &record{bucket: maps.Clone(id)}
		in.records[k] = r
	}
	if !allowed {
		r.denied++
		return Decision{Status: in.set.denyStatus}
	}
	r.admitted = append(r.admitted, wall.UnixNano())
	return Decision{Allowed: true}
}

// ReportNow fires the report timer once, now (once the first bucket has
// started it): for tests that drive reports on a manual clock.
func (in *Instance) ReportNow() { in.c.ReportNow() }

// ResetStream ends the current stream as if the server had closed it
// (onRemoteClose); the next report tick opens a new one.
func (in *Instance) ResetStream() { in.c.ResetStream() }

// Stats are the instance's counters.
func (in *Instance) Stats() Stats { return in.c.Stats() }

// Records are the instance's own records, one per bucket it ever saw,
// ordered by bucket.
func (in *Instance) Records() []BucketRecord {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]BucketRecord, 0, len(in.records))
	for _, k := range slices.Sorted(maps.Keys(in.records)) {
		out = append(out, in.records[k].export(in.cfg.Name))
	}
	return out
}

// FirstAssignments are, for every bucket the server assigned since the
// instance created it (again after an abandon), how long after the last
// report that carried the bucket its first assignment was applied: the
// server's report-to-assignment latency, measured from when the report
// was built (it is written at once when the stream is up). A report the
// server dropped (beyond its pace) counts from the next one that carried
// the bucket.
func (in *Instance) FirstAssignments() []time.Duration { return in.c.FirstAssignments() }

// BucketState is what the cache holds for a bucket now.
type BucketState struct {
	// Strategy is the cached action's strategy; nil is the default
	// action (no_assignment_behavior).
	Strategy *typev3.RateLimitStrategy
	// Assigned says Strategy is the server's assignment rather than the
	// expired-assignment fallback.
	Assigned bool
	// Until is when Strategy ends, on the instance's monotonic clock.
	Until time.Duration
	// Tokens is what the token bucket holds, if Strategy is one.
	Tokens float64
}

// State is bucket's cache entry now, after any expiry that fell due; false
// if the cache does not hold it (never seen, or abandoned).
func (in *Instance) State(bucket map[string]string) (BucketState, bool) {
	st, ok := in.c.State(bucket)
	if !ok {
		return BucketState{}, false
	}
	out := BucketState{Assigned: st.Phase == envoy.Assigned, Until: st.Until, Tokens: st.Tokens}
	switch st.Phase {
	case envoy.Assigned:
		out.Strategy = quotalease.StrategyProto(st.Strategy)
	case envoy.Fallback:
		out.Strategy = in.set.fallback
	}
	return out, true
}
