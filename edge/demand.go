package edge

import "time"

// Rate is the request rate of a usage report of count requests (allowed
// and denied): over measured, the time since the same bucket's previous
// report on the stream as the agent received them, when known; else over
// elapsed, the report's time_elapsed. Envoy sends whole seconds there (0
// on a bucket's first report, 4s for 4.99s), so it is used only when at
// least a second and nothing better is known. ok is false when neither
// says anything.
func Rate(count uint64, elapsed, measured time.Duration) (perSecond float64, ok bool) {
	d := measured
	if d <= 0 {
		if elapsed < time.Second {
			return 0, false
		}
		d = elapsed
	}
	return float64(count) / d.Seconds(), true
}
