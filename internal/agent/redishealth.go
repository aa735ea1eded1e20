package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/logs"
)

// redisHealth is what the agent's own round trips to Redis (the presence
// loop's every second, the breaker probe's; not the checks') last found,
// so that readiness and the logs say how Redis fails: unreachable, slower
// than the check timeout, or refusing this agent's credentials. Failures
// are logged paced (outage): an outage is a few lines, the first at once
// and naming what to do. It is safe for concurrent use.
type redisHealth struct {
	log hclog.Logger
	now func() time.Time

	mu   sync.Mutex
	err  error // the last round trip's; nil: it worked
	down logs.Outage
}

func newRedisHealth(log hclog.Logger, now func() time.Time) *redisHealth {
	return &redisHealth{
		log:  log,
		now:  now,
		down: logs.Outage{What: "Redis", Interval: 30 * time.Second, Level: hclog.Warn},
	}
}

// record notes the outcome of a round trip to Redis (ctx's error, when
// ctx was cancelled, is not Redis's fault and is not recorded).
func (h *redisHealth) record(ctx context.Context, err error) {
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
	if err != nil {
		h.down.Failed(h.log, h.now(), "reason", redisProblem(err), "error", err)
		return
	}
	h.down.OK(h.log, h.now())
}

// last returns the last round trip's error, nil if it worked (or none was
// made yet).
func (h *redisHealth) last() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// redisProblem says in words what err, from a round trip to Redis, means
// for an operator, and what to do about it where that is clear.
func redisProblem(err error) string {
	var ne net.Error
	switch {
	case redis.IsAuthError(err):
		return "Redis refuses this agent's credentials (NOAUTH/WRONGPASS): give the agent the password Redis requires " +
			"(its requirepass, or the ACL user's) with --redis-password-file, QUOTALEASE_REDIS_PASSWORD or the " +
			"--redis URL, and restart it"
	case redis.IsPermissionError(err):
		return "Redis refuses a command to this agent's ACL user (NOPERM): allow it the agent's commands and " +
			"keys (docs/runbook.md)"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "Redis did not answer in time"
	default:
		return fmt.Sprintf("Redis unreachable: %v", err)
	}
}
