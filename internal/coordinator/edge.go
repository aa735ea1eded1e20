package coordinator

import (
	"math"
	"time"

	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// edgeReports keeps, for one quota, the latest edge summary each agent
// instance reported with a renewal (QuotaRequest.edge): what the Envoy
// instances streaming to its Rate Limit Quota Service hold of the quota.
// An instance's summary is dropped when the grant answering its last
// renewal ends, and with the leadership term (a new leader learns them
// again within a renewal interval). It is for people (`coordinator
// leases`, the console) and plays no part in any grant. The quota's mutex
// guards it.
type edgeReports struct {
	by    map[instanceKey]edgeReport
	sweep int // prune ended reports when the map reaches this size
}

type edgeReport struct {
	sum   *pb.EdgeSummary
	until time.Duration // monotonic reading (clock.Clock.Mono)
}

// record notes an instance's summary at now (a monotonic reading), kept
// for hold; nil forgets it (none of its Envoy instances holds a bucket).
// Unlike demand, usage is not capped at the quota's total: it is only
// shown, and how far the edge asks beyond the limit is worth seeing.
func (r *edgeReports) record(region, instance string, s *pb.EdgeSummary, now, hold time.Duration) {
	k := instanceKey{region, instance}
	if s == nil {
		delete(r.by, k)
		return
	}
	if r.by == nil {
		r.by, r.sweep = map[instanceKey]edgeReport{}, minSweep
	}
	r.by[k] = edgeReport{
		sum: &pb.EdgeSummary{
			Instances:        s.Instances,
			LibraryInstances: s.LibraryInstances,
			Buckets:          s.Buckets,
			Assigned:         s.Assigned,
			Usage:            s.Usage,
		},
		until: now + hold,
	}
	if len(r.by) >= r.sweep {
		for k, v := range r.by {
			if now >= v.until {
				delete(r.by, k)
			}
		}
		r.sweep = max(minSweep, 2*len(r.by))
	}
}

// region sums the summaries of region's agent instances whose grants have
// not ended at now, or returns nil when none reported one.
func (r *edgeReports) region(region string, now time.Duration) *pb.EdgeSummary {
	var out *pb.EdgeSummary
	for k, v := range r.by {
		if k.region != region || now >= v.until {
			continue
		}
		if out == nil {
			out = &pb.EdgeSummary{}
		}
		out.Agents++
		out.Instances = addInt32(out.Instances, v.sum.Instances)
		out.LibraryInstances = addInt32(out.LibraryInstances, v.sum.LibraryInstances)
		out.Buckets = addInt32(out.Buckets, v.sum.Buckets)
		out.Assigned = addInt64(out.Assigned, v.sum.Assigned)
		out.Usage = addInt64(out.Usage, v.sum.Usage)
	}
	return out
}

// validEdge checks a renewal's edge summary: counts and amounts are never
// negative, and the library's instances are some of the instances.
func validEdge(s *pb.EdgeSummary) bool {
	return s == nil || (s.Instances >= 0 && s.Buckets >= 0 && s.Assigned >= 0 && s.Usage >= 0 && s.Agents >= 0 &&
		s.LibraryInstances >= 0 && s.LibraryInstances <= s.Instances)
}

// addInt32 and addInt64 add two non-negative numbers, saturating.
func addInt32(a, b int32) int32 { return int32(min(int64(a)+int64(b), math.MaxInt32)) }

func addInt64(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
