package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A restarted agent process takes its instance name back at once. The
// coordinator keeps a name for the process that last renewed under it
// until that process's grants end, so that a second live process cannot
// evict the first; a restart (SIGKILL and start again, as a StatefulSet or
// systemd does) waited those grants out, serving its restored grant until
// it ended, and its Envoys went dark as that grant neared its end. So the
// agents keep in their region's Redis which process holds each name:
//
//	ql:instances:{<region>}  hash: instance -> nonce of the process holding it
//
// A process whose request is refused because its name is held reads its
// predecessor's nonce there, and that process's presence heartbeat in
// ql:agents:{<region>} (written every second, removed when it stops).
// Once the heartbeat is older than successionAfter, or gone, the
// predecessor is taken for dead and the next request names it
// (LeaseRequest.replaces): the coordinator hands the name over when that
// nonce holds it. A live process's heartbeat stays fresh, so it keeps its
// name; knowing its nonce takes access to the region's Redis.
func instancesKey(region string) string { return "ql:instances:{" + region + "}" }

// newNonce names one process of instance, started at now: random, so that
// only the processes that read it from the region's Redis know it, and led
// by the instance name, so that the presence hash counts a restarted
// process and the one it replaced as one instance (nonceInstance).
func newNonce(instance string, now time.Time) string {
	return fmt.Sprintf("%s-%d-%x", instance, now.UnixNano(), rand.Uint64())
}

// nonceInstance is the instance name a nonce of newNonce leads with.
func nonceInstance(nonce string) string {
	for range 2 {
		if i := strings.LastIndexByte(nonce, '-'); i >= 0 {
			nonce = nonce[:i]
		}
	}
	return nonce
}

// agentsKey is the region's presence hash (leaser.publish).
func agentsKey(region string) string { return "ql:agents:{" + region + "}" }

// successionAfter is how old a predecessor's heartbeat must be for a
// process to take its name: twice the heartbeat's period.
const successionAfter = 2 * time.Second

// succeed is called when a request was refused because another process
// holds this instance's name. It reads that process from Redis: when its
// heartbeat has stopped it is named in the next request, which is due at
// once; otherwise the next request waits until the heartbeat would have
// gone stale, or the refusal's own delay if that comes first.
func (l *leaser) succeed(ctx context.Context, rdb redis.UniversalClient) error {
	prev, err := rdb.HGet(ctx, instancesKey(l.region), l.instance).Result()
	if errors.Is(err, redis.Nil) || prev == l.nonce {
		return nil // nobody recorded: the name is held by a process from before this scheme, or by us
	}
	if err != nil {
		return fmt.Errorf("read the instance's holder: %w", err)
	}
	beat, err := rdb.HGet(ctx, agentsKey(l.region), "@"+prev).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read the holder's heartbeat: %w", err)
	}
	ms, _ := strconv.ParseInt(beat, 10, 64) // 0 when gone
	stale := time.UnixMilli(ms).Add(successionAfter)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.Before(stale) {
		l.replaces, l.predecessor, l.heldUntil = prev, prev, now
		l.log.Info("the process that held this instance name has stopped; taking the name over", "instance", l.instance)
		return nil
	}
	if stale.Before(l.heldUntil) {
		l.heldUntil = stale
	}
	return nil
}

// Succession names this process in its region's Redis (its nonce) and
// the stopped process it succeeded under its instance name ("" until one
// is known): the edge takes the Envoy instances that reconnect from that
// process as its own (edgeAgent).
func (l *leaser) Succession() (nonce, predecessor string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nonce, l.predecessor
}

// recordHolder is what publish writes to say this process holds its name
// (nothing until a request under it succeeded).
func (l *leaser) recordHolder() []any {
	if !l.named {
		return nil
	}
	return []any{l.instance, l.nonce}
}

// leave removes this process's heartbeat as it stops, so that its
// successor takes the name at once.
func (l *leaser) leave(ctx context.Context, rdb redis.UniversalClient) error {
	if err := rdb.HDel(ctx, agentsKey(l.region), "@"+l.nonce).Err(); err != nil {
		return fmt.Errorf("remove this process's heartbeat: %w", err)
	}
	return nil
}
