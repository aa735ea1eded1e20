package agent

import (
	"context"
	"math/rand/v2"
	"time"
)

// probeLoop closes the breaker in front of Redis once Redis answers again,
// without waiting for a check to probe it. Only a check used to: an agent
// left idle after an outage (its load balancer stops sending checks to an
// unready agent) stayed unready for good. While the breaker is open, the
// loop pings Redis in the breaker's half-open slot (admission's
// ProbeStore: after its cooldown, within the check timeout), first
// RedisProbeInterval after it opened, then backing off to
// RedisProbeMaxInterval while Redis keeps failing. It returns when ctx ends.
func (a *Agent) probeLoop(ctx context.Context) {
	wait := a.cfg.RedisProbeInterval
	for {
		if !a.admit.BreakerOpen() { // closed: nothing to probe until it opens
			select {
			case <-ctx.Done():
				return
			case <-a.admit.BreakerOpened():
			}
			wait = a.cfg.RedisProbeInterval
		}
		select { // jittered by up to a quarter, so that a region's agents do not probe in step
		case <-ctx.Done():
			return
		case <-time.After(wait - time.Duration(rand.Int64N(int64(wait/4)+1))):
		}
		probed, err := a.admit.ProbeStore(ctx, a.pingRedis)
		switch {
		case !probed && !a.admit.BreakerOpen():
			wait = a.cfg.RedisProbeInterval // closed: ready for the next outage
			continue
		case !probed: // open, but a check is probing or the cooldown is not over
			continue
		}
		a.health.record(ctx, err)
		a.m.breakerOpen.Set(boolGauge(a.admit.BreakerOpen()))
		if err == nil {
			a.cfg.Logger.Info("Redis answers again: the breaker in front of it is closed, checks go to Redis")
			wait = a.cfg.RedisProbeInterval
			continue
		}
		wait = min(2*wait, a.cfg.RedisProbeMaxInterval)
	}
}

// pingRedis is one round trip to the region's Redis.
func (a *Agent) pingRedis(ctx context.Context) error { return a.cfg.Redis.Ping(ctx).Err() }
