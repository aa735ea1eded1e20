package agent

import (
	"time"

	"github.com/hashicorp/go-hclog"
)

// outage paces the log of a failure that repeats (a coordinator or Redis
// that is down): the first failure is logged at once, later ones at most
// every interval with how many there were meanwhile, and the first success
// after them says how long it lasted. An outage of a minute is a few lines,
// not one per attempt. Not safe for concurrent use.
type outage struct {
	what     string        // "lease renewals"
	interval time.Duration // between repeated warnings
	since    time.Time     // first failure of the current outage; zero while healthy
	logged   time.Time     // last warning
	failures int           // since the last warning
	total    int
}

func (o *outage) failed(log hclog.Logger, now time.Time, args ...any) {
	o.failures++
	o.total++
	if o.since.IsZero() {
		o.since, o.logged, o.failures = now, now, 0
		log.Warn(o.what+" failing", args...)
		return
	}
	if now.Sub(o.logged) >= o.interval {
		log.Warn(o.what+" still failing", append(args, "for", now.Sub(o.since).Round(time.Second), "failures_since_last_warning", o.failures)...)
		o.logged, o.failures = now, 0
	}
}

func (o *outage) ok(log hclog.Logger, now time.Time) {
	if o.since.IsZero() {
		return
	}
	log.Info(o.what+" recovered", "after", now.Sub(o.since).Round(100*time.Millisecond), "failures", o.total)
	*o = outage{what: o.what, interval: o.interval}
}
