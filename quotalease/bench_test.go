package quotalease_test

import (
	"testing"

	"golang.org/x/time/rate"
)

// BenchmarkAllow: one in-process decision on an assigned token bucket,
// through a Bucket handle and by map (Client.Allow), beside
// golang.org/x/time/rate's Limiter.Allow (one local limiter with no global
// bound) in the same run, for ratios. Run with
// go test -run '^$' -bench Allow -cpu 1,2 -count 2 ./quotalease
func BenchmarkAllow(b *testing.B) {
	_, _, c := assigned(b, 1<<30, 1<<30, nil)
	h := c.Bucket(acme)
	lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
	for _, x := range []struct {
		name  string
		allow func() bool
	}{
		{"handle", h.Allow},
		{"map", func() bool { return c.Allow(acme) }},
		{"x-time-rate", lim.Allow},
	} {
		b.Run(x.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					x.allow()
				}
			})
		})
	}
}
