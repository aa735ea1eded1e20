package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
)

// Config configures a coordinator replica.
type Config struct {
	// Name identifies this replica in logs and the election.
	Name string
	// Advertise is the gRPC address other parties reach this replica at;
	// followers hand it out as the leader's address.
	Advertise string
	// Prefix is the etcd key prefix all state lives under.
	Prefix string
	// Regions are declared at start if etcd has none yet.
	Regions []string
	// Timing of leases.
	Timing lease.Timing
	// SessionTTL is the etcd session (leadership) TTL. Failover takes
	// about this long.
	SessionTTL time.Duration
	// EtcdTimeout bounds every etcd call the replica makes (a handler's
	// call also by most of what is left of its caller's deadline): past
	// it, etcd counts as unreachable, which the log, /readyz and the
	// answers say.
	EtcdTimeout time.Duration
	// RebalanceInterval is how often shares are recomputed.
	RebalanceInterval time.Duration
	// FlushInterval is how often lowered ledger marks are written.
	FlushInterval time.Duration
	// CompactionInterval is how often the leader compacts etcd's history
	// up to the revision it read one interval earlier (compaction.go);
	// 0 turns compaction off, for an etcd compacted another way.
	CompactionInterval time.Duration
	// Strategy allocates shares.
	Strategy allocation.Strategy
	// MaxStep and Hysteresis, as fractions of a quota's total, damp
	// rebalancing.
	MaxStep, Hysteresis float64
	// TrustDomain, when set, turns authorization on: every call needs a
	// client certificate naming an identity of this SPIFFE trust domain
	// (see Authorize). Empty on a plaintext, loopback-only listener.
	TrustDomain string
	// LeaseCallRate bounds the Lease calls per second one region's
	// identity may make (with authorization on); more are refused with
	// ResourceExhausted before they touch the ledger. An agent instance
	// renews about every third of a lease. Default 100; negative: no limit.
	LeaseCallRate float64
	// StoreLag is how much of its latest writes a region's Redis may lose
	// when it fails over to a replica; it enters the published bound as
	// the store-lag term. Zero where Redis does not fail over to replicas.
	StoreLag time.Duration
	// RedisClockStep is the most a region's Redis clock may step back
	// within one window; it enters the published bound of fixed-window
	// policies as the window-clock term. Zero where Redis hosts slew their
	// clocks.
	RedisClockStep time.Duration
	// RateLimitXDS, when set, subscribes the leader to an xDS management
	// server for envoyproxy/ratelimit's configuration (RateLimitConfig
	// resources) and stores what it serves as policies, next to quota
	// set (docs/envoy.md, "Configuration over xDS"). Give every replica
	// the same.
	RateLimitXDS *ratelimitxds.Settings
	// Clock is the time source: wall time for grants and records, its
	// monotonic reading for the leadership lease. clock.System() by
	// default.
	Clock clock.Clock
	// Logger; a default hclog logger when nil.
	Logger hclog.Logger
}

// Defaults for Config.
const (
	DefaultPrefix             = "/quota-lease"
	DefaultSessionTTL         = 5 * time.Second
	DefaultEtcdTimeout        = 3 * time.Second
	DefaultRebalanceInterval  = time.Second
	DefaultFlushInterval      = time.Second
	DefaultCompactionInterval = 5 * time.Minute
	DefaultMaxStep            = 0.1
	DefaultHysteresis         = 0.01
	DefaultLeaseCallRate      = 100
)

// DefaultConfig returns a Config with every field at its default: start
// from it and set what differs (Name and Advertise have no default). As in
// hashicorp/raft, a zero is a value, never a request for the default:
// Hysteresis 0 means no hysteresis.
func DefaultConfig() Config {
	return Config{
		Prefix:             DefaultPrefix,
		Timing:             lease.DefaultTiming,
		SessionTTL:         DefaultSessionTTL,
		EtcdTimeout:        DefaultEtcdTimeout,
		RebalanceInterval:  DefaultRebalanceInterval,
		FlushInterval:      DefaultFlushInterval,
		CompactionInterval: DefaultCompactionInterval,
		Strategy:           allocation.StrategyMaxMinFair,
		MaxStep:            DefaultMaxStep,
		Hysteresis:         DefaultHysteresis,
		LeaseCallRate:      DefaultLeaseCallRate,
		Clock:              clock.System(),
		Logger:             hclog.New(&hclog.LoggerOptions{Name: "coordinator"}),
	}
}

// ValidateConfig reports every setting of c that cannot work, joined.
func ValidateConfig(c Config) error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("name is empty"))
	}
	if c.Advertise == "" {
		errs = append(errs, errors.New("advertise address is empty"))
	}
	if strings.Trim(c.Prefix, "/") == "" {
		errs = append(errs, fmt.Errorf("etcd prefix %q names no key space", c.Prefix))
	}
	if c.Clock == nil || c.Logger == nil {
		errs = append(errs, errors.New("clock and logger must be set (start from DefaultConfig)"))
	}
	if c.LeaseCallRate == 0 {
		errs = append(errs, errors.New("lease call rate 0 would refuse every lease; use a negative rate for no limit"))
	}
	if err := c.Timing.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SessionTTL < time.Second {
		errs = append(errs, fmt.Errorf("session TTL %s is below 1s", c.SessionTTL))
	}
	if c.EtcdTimeout <= 0 {
		errs = append(errs, fmt.Errorf("etcd timeout %s must be positive", c.EtcdTimeout))
	}
	if c.StoreLag < 0 {
		errs = append(errs, fmt.Errorf("store lag %s is negative", c.StoreLag))
	}
	if c.RedisClockStep < 0 {
		errs = append(errs, fmt.Errorf("Redis clock step %s is negative", c.RedisClockStep))
	}
	if c.RebalanceInterval <= 0 || c.FlushInterval <= 0 {
		errs = append(errs, errors.New("rebalance and flush intervals must be positive"))
	}
	if c.CompactionInterval < 0 {
		errs = append(errs, fmt.Errorf("etcd compaction interval %s is negative (0 turns compaction off)",
			c.CompactionInterval))
	}
	if c.MaxStep <= 0 || c.MaxStep > 1 || c.Hysteresis < 0 || c.Hysteresis >= 1 {
		errs = append(errs, fmt.Errorf("max step %v must be in (0, 1] and hysteresis %v in [0, 1)", c.MaxStep, c.Hysteresis))
	}
	if _, err := allocation.Allocate(c.Strategy, 1, nil); err != nil {
		errs = append(errs, err)
	}
	if c.RateLimitXDS != nil {
		if err := c.RateLimitXDS.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range c.Regions {
		if !policy.RegionNameRE.MatchString(r) {
			errs = append(errs, fmt.Errorf("region name %q must be 1-63 characters of a-z, 0-9 and '-'", r))
		}
	}
	return errors.Join(errs...)
}
