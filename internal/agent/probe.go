package agent

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/admission"
)

// redisProbe closes the breaker in front of Redis once Redis answers
// again, without waiting for a check to probe it. Only a check used to: an
// agent left idle after an outage (its load balancer stops sending checks
// to an unready agent) stayed unready for good.
type redisProbe struct {
	admit  *admission.Pipeline
	ping   func(context.Context) error // one round trip to the region's Redis
	health *redisHealth
	open   prometheus.Gauge // the breaker is open
	log    hclog.Logger
	// every is the first wait after the breaker opens; the wait doubles
	// up to most while Redis keeps failing.
	every, most time.Duration
}

// run pings Redis, while the breaker is open, in the breaker's half-open
// slot (admission's ProbeStore: after its cooldown, within the check
// timeout), first p.every after it opened, then backing off to p.most. It
// returns when ctx ends.
func (p redisProbe) run(ctx context.Context) {
	wait := p.every
	for {
		if !p.admit.BreakerOpen() { // closed: nothing to probe until it opens
			select {
			case <-ctx.Done():
				return
			case <-p.admit.BreakerOpened():
			}
			wait = p.every
		}
		select { // jittered by up to a quarter, so that a region's agents do not probe in step
		case <-ctx.Done():
			return
		case <-time.After(wait - time.Duration(rand.Int64N(int64(wait/4)+1))):
		}
		probed, err := p.admit.ProbeStore(ctx, p.ping)
		switch {
		case !probed && !p.admit.BreakerOpen():
			wait = p.every // closed: ready for the next outage
			continue
		case !probed: // open, but a check is probing or the cooldown is not over
			continue
		}
		p.health.record(ctx, err)
		p.open.Set(boolGauge(p.admit.BreakerOpen()))
		if err == nil {
			p.log.Info("Redis answers again: the breaker in front of it is closed, checks go to Redis")
			wait = p.every
			continue
		}
		wait = min(2*wait, p.most)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
