package main

import (
	"flag"

	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
)

// edgeFlags defines the flags of the agent's Rate Limit Quota Service
// (Envoy's RLQS, docs/rlqs-server.md) into e, defaulting to
// rlqs.DefaultConfig.
func edgeFlags(fs *flag.FlagSet, e *rlqs.Config) {
	d := rlqs.DefaultConfig()
	fs.DurationVar(&e.Tick, "edge-tick", d.Tick,
		"RLQS: how often, at most, the agent plans the identities whose reports, capacity or assignments call "+
			"for it and pushes assignments to Envoy; it writes a growing edge reservation to the region's Redis at "+
			"once, and reads the region's (the other agents') about every half --edge-grow-wait")
	fs.DurationVar(&e.GrowWait, "edge-grow-wait", d.GrowWait,
		"RLQS: how long a larger edge reservation waits before an assignment uses it, so that every agent of "+
			"the region has read it; the same on every agent of a region, more than twice --edge-tick")
	fs.DurationVar(&e.Margin, "edge-margin", d.Margin,
		"RLQS: added to every assignment's time to live for its delivery to Envoy (the agent counts an "+
			"assignment this much longer)")
	fs.DurationVar(&e.ChangeEvery, "edge-change-every", d.ChangeEvery,
		"RLQS: least time between changes of one bucket's assignment on one Envoy instance; with "+
			"--edge-envoy-keeps-fill=false, shorter makes token buckets smaller (each change may start one full)")
	fs.Float64Var(&e.BurstFraction, "edge-burst-fraction", d.BurstFraction,
		"RLQS: most of an Envoy instance's refill given up to pay for token buckets that start full, in (0, 1)")
	fs.BoolVar(&e.KeepsFill, "edge-envoy-keeps-fill", d.KeepsFill,
		"RLQS: the Envoy fleet starts a token bucket that replaces an assigned one at the old one's fill ratio "+
			"(Envoy with PR #37624, merged January 2025), so a bucket may hold its share's whole burst and changes "+
			"cost no start; false for older Envoy, whose changed buckets may start full")
	fs.DurationVar(&e.RepayOver, "edge-repay-over", d.RepayOver,
		"RLQS, with --edge-envoy-keeps-fill: time over which a held bucket's refill rebuilds (half of) the room "+
			"a start used; longer gives up less refill, and a bucket grows back more slowly after a share that "+
			"shrank and grew again")
	fs.DurationVar(&e.AbandonAfter, "edge-abandon-after", d.AbandonAfter,
		"RLQS: tell Envoy to drop a bucket (AbandonAction) that reported no requests for this long; at least "+
			"--edge-change-every")
	fs.IntVar(&e.MaxBucketsPerStream, "edge-max-buckets", d.MaxBucketsPerStream,
		"RLQS: most buckets one Envoy instance may report; more are ignored and counted "+
			"(quotalease_agent_edge_reports_limited_total{reason=\"buckets\"})")
	fs.IntVar(&e.MaxStreams, "edge-max-streams", d.MaxStreams,
		"RLQS: most streams (Envoy instances and domains) the agent serves at once; one more is refused with "+
			"RESOURCE_EXHAUSTED, and Envoy retries ({reason=\"streams\"})")
	fs.IntVar(&e.MaxBuckets, "edge-max-agent-buckets", d.MaxBuckets,
		"RLQS: most buckets of all streams together; more are ignored and counted ({reason=\"agent-buckets\"})")
	fs.IntVar(&e.MaxStreamsPerCaller, "edge-max-streams-per-caller", d.MaxStreamsPerCaller,
		"RLQS: most streams one caller may hold on the agent: one client certificate (Envoys sharing one are one "+
			"caller), or one address without one; one more is refused with RESOURCE_EXHAUSTED "+
			"({reason=\"caller-streams\"}); 0: half of --edge-max-streams")
	fs.IntVar(&e.MaxBucketsPerCaller, "edge-max-buckets-per-caller", d.MaxBucketsPerCaller,
		"RLQS: most buckets of one caller's streams together; more are ignored and counted "+
			"({reason=\"caller-buckets\"}); 0: half of --edge-max-agent-buckets")
	fs.IntVar(&e.MaxIdentities, "edge-max-identities", d.MaxIdentities,
		"RLQS: most policy identities (e.g. tenants) the agent serves at the edge at once; each is a field of "+
			"the region's edge reservations in Redis, which every agent of the region reads whole every 30 s "+
			"(about 6 µs of Redis a field; between whole reads, every half --edge-grow-wait, only the fields "+
			"written since); a bucket of one more is ignored and counted ({reason=\"identities\"})")
	fs.Float64Var(&e.ReportsPerSecond, "edge-reports-per-second", d.ReportsPerSecond,
		"RLQS: pace of one Envoy stream's usage reports (Envoy sends one every reporting interval and one per "+
			"new bucket); more are dropped and counted (reason=\"rate\")")
	fs.IntVar(&e.ReportBurst, "edge-report-burst", d.ReportBurst,
		"RLQS: reports one Envoy stream may send at once above --edge-reports-per-second")
}
