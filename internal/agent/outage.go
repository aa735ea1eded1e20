package agent

import (
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/logs"
)

// outage paces the log of a failure that repeats (a coordinator or Redis
// that is down) as logs.Outage does, at warn level: the first failure at
// once, later ones at most every interval, and the recovery. Not safe for
// concurrent use.
type outage struct {
	what     string        // "lease renewals"
	interval time.Duration // between repeated warnings
	paced    logs.Outage
}

func (o *outage) failed(log hclog.Logger, now time.Time, args ...any) {
	o.paced.What, o.paced.Interval, o.paced.Level = o.what, o.interval, hclog.Warn
	o.paced.Failed(log, now, args...)
}

func (o *outage) ok(log hclog.Logger, now time.Time) { o.paced.OK(log, now) }
