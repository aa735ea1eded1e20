package rlqsenvoy

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// key is a BucketId map's identity: Envoy hashes the proto
// (MessageUtil::hash), for which key order does not matter; here the
// sorted, quoted pairs.
func key(bucket map[string]string) string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(bucket)) {
		sb.WriteString(strconv.Quote(k))
		sb.WriteByte('=')
		sb.WriteString(strconv.Quote(bucket[k]))
		sb.WriteByte(',')
	}
	return sb.String()
}

// record is what the instance itself saw of one bucket, kept apart from
// Envoy's bucket cache so that it survives abandons.
type record struct {
	bucket   map[string]string
	admitted []int64 // wall-clock Unix nanoseconds of each admitted request
	denied   uint64
}

// BucketRecord is an instance's own account of one bucket: every request
// it admitted, with its wall-clock time, and how many it denied. A safety
// test recounts admissions from these, per window, against the bound the
// server published.
type BucketRecord struct {
	Instance string
	Bucket   map[string]string
	Admitted []time.Time
	Denied   uint64
}

// AdmittedIn is how many of r's admissions fall in [from, to).
func (r BucketRecord) AdmittedIn(from, to time.Time) int {
	lo, _ := slices.BinarySearchFunc(r.Admitted, from, time.Time.Compare)
	hi, _ := slices.BinarySearchFunc(r.Admitted, to, time.Time.Compare)
	return hi - lo
}

func (r *record) export(instance string) BucketRecord {
	out := BucketRecord{Instance: instance, Bucket: maps.Clone(r.bucket), Denied: r.denied,
		Admitted: make([]time.Time, len(r.admitted))}
	for i, ns := range r.admitted {
		out.Admitted[i] = time.Unix(0, ns)
	}
	// Requests decided concurrently may be recorded slightly out of order.
	slices.SortFunc(out.Admitted, time.Time.Compare)
	return out
}

// Stats are an instance's counters.
type Stats struct {
	Allowed, Denied uint64 // requests decided
	Buckets         int    // buckets in the cache now
	FirstReports    uint64 // single-bucket reports of new buckets, queued
	PeriodicReports uint64 // reports of every bucket, built on the report timer
	Sent            uint64 // messages written to a stream
	Dropped         uint64 // reports built but never written (stream down, start failed, queue full)
	Responses       uint64 // RateLimitQuotaResponse messages received
	Assignments     uint64 // quota assignments applied
	Ignored         uint64 // bucket actions ignored (unknown bucket, no id, requests_per_time_unit, no strategy)
	Abandoned       uint64 // buckets erased by an abandon action
	StreamStarts    uint64 // streams opened
	StreamFailures  uint64 // stream starts that failed
	StreamsClosed   uint64 // open streams that ended (server close, error, ResetStream)
}

func (s *Stats) add(o Stats) {
	s.Allowed += o.Allowed
	s.Denied += o.Denied
	s.Buckets += o.Buckets
	s.FirstReports += o.FirstReports
	s.PeriodicReports += o.PeriodicReports
	s.Sent += o.Sent
	s.Dropped += o.Dropped
	s.Responses += o.Responses
	s.Assignments += o.Assignments
	s.Ignored += o.Ignored
	s.Abandoned += o.Abandoned
	s.StreamStarts += o.StreamStarts
	s.StreamFailures += o.StreamFailures
	s.StreamsClosed += o.StreamsClosed
}
