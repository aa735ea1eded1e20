package rlqs

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge"
)

// Config configures the agent's Rate Limit Quota Service (RLQS): the
// Envoy instances it assigns token buckets to (docs/rlqs.md).
type Config struct {
	// Tuning are the rounds' settings (edge.Tuning says each, and its
	// default).
	edge.Tuning
	// MaxBucketsPerStream caps the buckets one Envoy instance may report;
	// more are ignored and counted. Default 10,000.
	MaxBucketsPerStream int
	// MaxStreams caps the RLQS streams the agent serves at once; one more
	// is refused with ResourceExhausted and counted. MaxBuckets caps the
	// buckets of all its streams together; more are ignored and counted.
	// Defaults 1,000 and 100,000: at most 4 KiB a bucket id, 400 MB.
	MaxStreams, MaxBuckets int
	// MaxStreamsPerCaller and MaxBucketsPerCaller cap what one caller may
	// hold of them: one client certificate (a fleet of Envoys sharing one
	// is one caller), or one address over plaintext. A caller's stream
	// beyond is refused with ResourceExhausted, its bucket beyond ignored,
	// both counted, so that one certificate cannot take the agent's whole
	// budget from the others. 0 (the default) is half the agent's:
	// MaxStreams/2 and MaxBuckets/2.
	MaxStreamsPerCaller, MaxBucketsPerCaller int
	// MaxIdentities caps the policy identities the agent serves at the
	// edge at once: each is a field of the region's reservations, which
	// every agent of the region reads whole every 30 s (about 6 µs of
	// Redis a field; between, only the fields written since:
	// regional.EdgeStore), and holds in memory. A bucket of one more is
	// ignored and counted. Default 10,000.
	MaxIdentities int
	// ReportsPerSecond and ReportBurst pace the messages of one stream
	// (Envoy sends one every reporting interval and one per new bucket);
	// more are dropped and counted. Defaults 20 and 200.
	ReportsPerSecond float64
	ReportBurst      int
}

// DefaultConfig returns the RLQS settings' defaults.
func DefaultConfig() Config {
	return Config{
		Tuning:              edge.DefaultTuning(),
		MaxBucketsPerStream: 10_000,
		MaxStreams:          1_000,
		MaxBuckets:          100_000,
		MaxIdentities:       10_000,
		ReportsPerSecond:    20,
		ReportBurst:         200,
	}
}

// callerStreams and callerBuckets are what one caller may hold: as set,
// or half the agent's.
func (c Config) callerStreams() int { return perCaller(c.MaxStreamsPerCaller, c.MaxStreams) }
func (c Config) callerBuckets() int { return perCaller(c.MaxBucketsPerCaller, c.MaxBuckets) }

func perCaller(set, agent int) int {
	if set > 0 {
		return set
	}
	return max(1, agent/2)
}

// rounds is what the edge rounds run with: the tuning and the lease's
// drift bound.
func (c Config) rounds(drift float64) edge.Config {
	return edge.Config{Tuning: c.Tuning, Drift: drift}
}

// Validate reports every setting of c that cannot work, joined.
func (c Config) Validate() error {
	var errs []error
	if c.Tick <= 0 || c.GrowWait <= 2*c.Tick {
		errs = append(errs, fmt.Errorf("edge tick %s must be positive and the grow wait %s more than twice it",
			c.Tick, c.GrowWait))
	}
	if c.Margin < 0 || c.ChangeEvery <= 0 || c.AbandonAfter < c.ChangeEvery {
		errs = append(errs, fmt.Errorf("edge margin %s must not be negative, change interval %s must be "+
			"positive and abandon-after %s at least it", c.Margin, c.ChangeEvery, c.AbandonAfter))
	}
	if c.KeepsFill && c.RepayOver < time.Second {
		errs = append(errs, fmt.Errorf("edge repay-over %s must be at least 1s", c.RepayOver))
	}
	if math.IsNaN(c.BurstFraction) || c.BurstFraction <= 0 || c.BurstFraction >= 1 {
		errs = append(errs, fmt.Errorf("edge burst fraction %v must be in (0, 1)", c.BurstFraction))
	}
	if c.MaxBucketsPerStream < 1 || c.MaxStreams < 1 || c.MaxBuckets < 1 || c.MaxIdentities < 1 || c.ReportBurst < 1 ||
		!(c.ReportsPerSecond > 0) {
		errs = append(errs, errors.New("edge max buckets per stream, max streams, max buckets, max identities, "+
			"report rate and report burst must be positive"))
	}
	if c.MaxStreamsPerCaller < 0 || c.MaxStreamsPerCaller > c.MaxStreams || c.MaxBucketsPerCaller < 0 ||
		c.MaxBucketsPerCaller > c.MaxBuckets {
		errs = append(errs, fmt.Errorf("edge max streams per caller %d and max buckets per caller %d must be "+
			"within the agent's (%d and %d), or 0 for half of them", c.MaxStreamsPerCaller, c.MaxBucketsPerCaller,
			c.MaxStreams, c.MaxBuckets))
	}
	return errors.Join(errs...)
}
