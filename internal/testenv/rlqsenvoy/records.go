package rlqsenvoy

import (
	"maps"
	"slices"
	"time"
)

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
	InstanceName string
	Bucket       map[string]string
	Admitted     []time.Time
	Denied       uint64
}

// AdmittedIn is how many of r's admissions fall in [from, to).
func (r BucketRecord) AdmittedIn(from, to time.Time) int {
	lo, _ := slices.BinarySearchFunc(r.Admitted, from, time.Time.Compare)
	hi, _ := slices.BinarySearchFunc(r.Admitted, to, time.Time.Compare)
	return hi - lo
}

func (r *record) export(instance string) BucketRecord {
	out := BucketRecord{InstanceName: instance, Bucket: maps.Clone(r.bucket), Denied: r.denied,
		Admitted: make([]time.Time, len(r.admitted))}
	for i, ns := range r.admitted {
		out.Admitted[i] = time.Unix(0, ns)
	}
	// Requests decided concurrently may be recorded slightly out of order.
	slices.SortFunc(out.Admitted, time.Time.Compare)
	return out
}
