package quotalease_test

import (
	"testing"

	"golang.org/x/time/rate"
)

// BenchmarkAllow: one in-process decision on an assigned token bucket,
// beside golang.org/x/time/rate's Limiter.Allow (a local limiter with no
// global bound) in the same run, for a ratio. Run with
// go test -run '^$' -bench Allow -cpu 1,2 ./quotalease
func BenchmarkAllow(b *testing.B) {
	_, _, c := assigned(b, 1<<30, 1<<30, nil)
	b.Run("quotalease", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Allow(acme)
			}
		})
	})
	lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
	b.Run("x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

// BenchmarkBucketAllow: Allow through a Bucket handle, which skips
// building the key, beside x/time/rate in the same run. Run with
// go test -run '^$' -bench BucketAllow -cpu 1,2 ./quotalease
func BenchmarkBucketAllow(b *testing.B) {
	_, _, c := assigned(b, 1<<30, 1<<30, nil)
	h := c.Bucket(acme)
	b.Run("quotalease", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.Allow()
			}
		})
	})
	lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
	b.Run("x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}
