package quotalease

// Stats are a client's counters.
type Stats struct {
	Allowed, Denied uint64 // units decided
	Buckets         int    // buckets held now
	FirstReports    uint64 // single-bucket reports of new buckets, queued
	PeriodicReports uint64 // reports of every bucket, built on the report timer
	Sent            uint64 // messages written to a stream
	Dropped         uint64 // reports built but never written (stream down, start failed, queue full)
	Responses       uint64 // RateLimitQuotaResponse messages received
	Assignments     uint64 // quota assignments applied
	Ignored         uint64 // bucket actions ignored (unknown bucket, no id, requests_per_time_unit, no strategy)
	Abandoned       uint64 // buckets erased by an abandon action
	Forgotten       uint64 // buckets dropped after ForgetAfter without a request
	StreamStarts    uint64 // streams opened
	StreamFailures  uint64 // stream starts that failed
	StreamsClosed   uint64 // open streams that ended (agent close, error, ResetStream)
}

// Add adds o's counters to s.
func (s *Stats) Add(o Stats) {
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
	s.Forgotten += o.Forgotten
	s.StreamStarts += o.StreamStarts
	s.StreamFailures += o.StreamFailures
	s.StreamsClosed += o.StreamsClosed
}
