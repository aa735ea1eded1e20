package edge

import "time"

// Rate is the request rate of a usage report of count requests (allowed
// and denied): over elapsed, the report's time_elapsed, when it has a part
// of a second (the client library measures it on its own clock, free of
// the network's and the agent's delays); else over measured, the time
// since the same bucket's previous report on the stream as the agent
// received them, when known; else over elapsed. Envoy sends whole seconds
// there (0 on a bucket's first report, 4s for 4.99s), so from Envoy it is
// used only when at least a second and nothing better is known. ok is
// false when nothing says anything.
func Rate(count uint64, elapsed, measured time.Duration) (perSecond float64, ok bool) {
	if elapsed > 0 && elapsed%time.Second != 0 {
		return float64(count) / elapsed.Seconds(), true
	}
	d := measured
	if d <= 0 {
		if elapsed < time.Second {
			return 0, false
		}
		d = elapsed
	}
	return float64(count) / d.Seconds(), true
}
