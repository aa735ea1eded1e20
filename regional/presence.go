package regional

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

// A region's agent processes publish their presence every second: a
// heartbeat per process ("@<nonce>": wall ms) and each quota's demand
// ("<quota>|<nonce>": "<demand>:<wall ms>"), from which every process reads
// the region's demand and how many instances serve it. A process that
// stops removes its heartbeat (Leave).
//
// They also record which process holds each instance name (ql:instances):
// a process refused because its name is held reads its predecessor there,
// and that one's heartbeat; once the heartbeat is stale or gone the
// predecessor is taken for dead and the name is claimed from the
// coordinator (LeaseRequest.replaces). Knowing a process's nonce takes
// access to the region's Redis.

// NewNonce names one process of instance, started at now: random, so that
// only the processes that read it from the region's Redis know it, and led
// by the instance name, so that the presence counts a restarted process
// and the one it replaced as one instance.
func NewNonce(instance string, now time.Time) string {
	return fmt.Sprintf("%s-%d-%x", instance, now.UnixNano(), rand.Uint64())
}

// nonceInstance is the instance name a nonce of NewNonce leads with.
func nonceInstance(nonce string) string {
	for range 2 {
		if i := strings.LastIndexByte(nonce, '-'); i >= 0 {
			nonce = nonce[:i]
		}
	}
	return nonce
}

// Presence is what one process publishes.
type Presence struct {
	Nonce string
	At    time.Time        // its wall clock
	Quota map[string]int64 // demand per quota (amount units)
	// Holds is its instance name, once a request under it succeeded: the
	// record says this process holds it ("" records nothing).
	Holds string
}

// Present is the region as a publish read it.
type Present struct {
	Demand    map[string]int64 // per quota, summed over the live processes
	Instances int              // live instances, at least 1
}

// Publish writes p and reads the region's presence: what the processes
// seen within staleAfter publish (older entries are removed).
func (r *Region) Publish(ctx context.Context, p Presence, staleAfter time.Duration) (Present, error) {
	key := r.Key("agents")
	at := strconv.FormatInt(p.At.UnixMilli(), 10)
	fields := make([]any, 0, 2*len(p.Quota)+2)
	fields = append(fields, "@"+p.Nonce, at)
	for q, d := range p.Quota {
		fields = append(fields, q+"|"+p.Nonce, strconv.FormatInt(d, 10)+":"+at)
	}
	pipe := r.rdb.Pipeline()
	pipe.HSet(ctx, key, fields...)
	pipe.PExpire(ctx, key, 10*staleAfter)
	if p.Holds != "" {
		pipe.HSet(ctx, r.Key("instances"), p.Holds, p.Nonce)
		pipe.PExpire(ctx, r.Key("instances"), savedTTL)
	}
	all := pipe.HGetAll(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		return Present{}, fmt.Errorf("publish demand: %w", err)
	}
	cutoff := p.At.Add(-staleAfter).UnixMilli()
	out := Present{Demand: map[string]int64{}}
	var stale []string
	live := map[string]bool{} // instance names with a fresh heartbeat
	for f, v := range all.Val() {
		val, ts, _ := strings.Cut(v, ":")
		if strings.HasPrefix(f, "@") {
			ts = val
		}
		t, _ := strconv.ParseInt(ts, 10, 64)
		if t < cutoff {
			stale = append(stale, f)
			continue
		}
		if strings.HasPrefix(f, "@") {
			live[nonceInstance(f[1:])] = true
			continue
		}
		quota, _, _ := strings.Cut(f, "|")
		d, _ := strconv.ParseInt(val, 10, 64)
		out.Demand[quota] += d
	}
	if len(stale) > 0 {
		r.rdb.HDel(ctx, key, stale...) // best effort: the next publish removes them too
	}
	out.Instances = max(1, len(live))
	return out, nil
}

// Holder is the nonce of the process recorded as holding instance, and
// when its heartbeat was last written (zero when it is gone); "" when none
// is recorded.
func (r *Region) Holder(ctx context.Context, instance string) (nonce string, beat time.Time, err error) {
	nonce, err = r.rdb.HGet(ctx, r.Key("instances"), instance).Result()
	if errors.Is(err, redis.Nil) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("read the instance's holder: %w", err)
	}
	ms, err := r.rdb.HGet(ctx, r.Key("agents"), "@"+nonce).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return nonce, time.Time{}, nil
	case err != nil:
		return "", time.Time{}, fmt.Errorf("read the holder's heartbeat: %w", err)
	}
	return nonce, time.UnixMilli(ms), nil
}

// Leave removes the heartbeat of the process of nonce as it stops, so that
// its successor takes its name at once.
func (r *Region) Leave(ctx context.Context, nonce string) error {
	if err := r.rdb.HDel(ctx, r.Key("agents"), "@"+nonce).Err(); err != nil {
		return fmt.Errorf("remove this process's heartbeat: %w", err)
	}
	return nil
}
