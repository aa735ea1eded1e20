package agent

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quota-lease/quota-lease/edge"
)

// EdgeConfig configures the agent's Rate Limit Quota Service (RLQS): the
// Envoy instances it assigns token buckets to (docs/rlqs.md).
type EdgeConfig struct {
	// Tick is how often the agent syncs its edge reservations with the
	// region's Redis (reading the other agents' too) and pushes
	// assignments. Default 100ms.
	Tick time.Duration
	// GrowWait is how long a larger reservation is held before an
	// assignment uses it, so that every agent of the region has read it
	// by then (each reads every Tick; one whose last read is older than
	// GrowWait leaves the edge's policies nothing for direct checks). It
	// must be the same on every agent of a region, and well above Tick
	// plus a Redis round trip. Default 500ms.
	GrowWait time.Duration
	// Margin is added to every assignment's time to live for its delivery
	// to Envoy (the stream, Envoy's main thread): the agent counts an
	// assignment that long after it sent it. Default 500ms.
	Margin time.Duration
	// ChangeEvery is the least time between changes of one bucket's
	// assignment on one stream: a changed token bucket may start full, and
	// its size pays for one start per ChangeEvery (a shorter interval
	// makes buckets smaller, edge.Assign). Default 1s.
	ChangeEvery time.Duration
	// BurstFraction is the part of an instance's refill given up to pay
	// for buckets that start full (edge.Assign). Default 0.05.
	BurstFraction float64
	// AbandonAfter is how long a bucket reports no requests before its
	// Envoy instance is told to drop it (AbandonAction). Default 1m.
	AbandonAfter time.Duration
	// MaxBucketsPerStream caps the buckets one Envoy instance may report;
	// more are ignored and counted. Default 10,000.
	MaxBucketsPerStream int
	// ReportsPerSecond and ReportBurst pace the messages of one stream
	// (Envoy sends one every reporting interval and one per new bucket);
	// more are dropped and counted. Defaults 20 and 200.
	ReportsPerSecond float64
	ReportBurst      int
}

// DefaultEdgeConfig returns the RLQS settings' defaults.
func DefaultEdgeConfig() EdgeConfig {
	return EdgeConfig{Tick: 100 * time.Millisecond, GrowWait: 500 * time.Millisecond, Margin: 500 * time.Millisecond,
		ChangeEvery: time.Second, BurstFraction: edge.DefaultBurstFraction, AbandonAfter: time.Minute,
		MaxBucketsPerStream: 10_000, ReportsPerSecond: 20, ReportBurst: 200}
}

// Validate reports every setting of c that cannot work, joined.
func (c EdgeConfig) Validate() error {
	var errs []error
	if c.Tick <= 0 || c.GrowWait <= 2*c.Tick {
		errs = append(errs, fmt.Errorf("edge tick %s must be positive and the grow wait %s more than twice it", c.Tick, c.GrowWait))
	}
	if c.Margin < 0 || c.ChangeEvery <= 0 || c.AbandonAfter < c.ChangeEvery {
		errs = append(errs, fmt.Errorf("edge margin %s must not be negative, change interval %s must be positive and abandon-after %s at least it", c.Margin, c.ChangeEvery, c.AbandonAfter))
	}
	if math.IsNaN(c.BurstFraction) || c.BurstFraction <= 0 || c.BurstFraction >= 1 {
		errs = append(errs, fmt.Errorf("edge burst fraction %v must be in (0, 1)", c.BurstFraction))
	}
	if c.MaxBucketsPerStream < 1 || c.ReportBurst < 1 || !(c.ReportsPerSecond > 0) {
		errs = append(errs, errors.New("edge max buckets per stream, report rate and report burst must be positive"))
	}
	return errors.Join(errs...)
}
