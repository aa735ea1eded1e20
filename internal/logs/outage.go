package logs

import (
	"time"

	"github.com/hashicorp/go-hclog"
)

// Outage paces the log of a failure that repeats (a coordinator, Redis or
// etcd that is down): the first failure is logged at once, later ones at
// most every Interval with how many there were meanwhile, and the first
// success after them says how long it lasted. An outage of a minute is a
// few lines, not one per attempt. The zero value with What, Interval and
// Level set is ready; it is not safe for concurrent use.
type Outage struct {
	What     string        // what fails, as the lines start: "lease renewals"
	Interval time.Duration // between repeated lines
	Level    hclog.Level   // of the failure lines (hclog.Warn, hclog.Error); the recovery is logged at info

	since    time.Time // first failure of the current outage; zero while healthy
	logged   time.Time // last line
	failures int       // since the last line
	total    int
}

// Failed records a failure at now, logging it if it starts an outage or
// Interval has passed since the last line; args are the line's key-value
// pairs.
func (o *Outage) Failed(log hclog.Logger, now time.Time, args ...any) {
	o.failures++
	o.total++
	if o.since.IsZero() {
		o.since, o.logged, o.failures = now, now, 0
		log.Log(o.Level, o.What+" failing", args...)
		return
	}
	if now.Sub(o.logged) >= o.Interval {
		log.Log(o.Level, o.What+" still failing", append(args, "for", now.Sub(o.since).Round(time.Second),
			"failures_since_last_line", o.failures)...)
		o.logged, o.failures = now, 0
	}
}

// OK records a success at now, logging the end of an outage if one was
// going on.
func (o *Outage) OK(log hclog.Logger, now time.Time) {
	if o.since.IsZero() {
		return
	}
	log.Info(o.What+" recovered", "after", now.Sub(o.since).Round(100*time.Millisecond), "failures", o.total)
	o.since, o.logged, o.failures, o.total = time.Time{}, time.Time{}, 0, 0
}

// Since is when the current outage began; zero while healthy.
func (o *Outage) Since() time.Time { return o.since }
