package agent

import (
	"context"
	"time"
)

// A restarted agent process takes its instance name back at once. The
// coordinator keeps a name for the process that last renewed under it
// until that process's grants end, so that a second live process cannot
// evict the first; a restart (SIGKILL and start again, as a StatefulSet or
// systemd does) waited those grants out, serving its restored grant until
// it ended, and its Envoys went dark as that grant neared its end. So the
// agents record in their region's Redis which process holds each name
// (regional.Region.Holder), beside each process's presence heartbeat
// (written every second, removed when it stops).
//
// A process whose request is refused because its name is held reads its
// predecessor and that one's heartbeat. Once the heartbeat is older than
// successionAfter, or gone, the predecessor is taken for dead and the next
// request names it (LeaseRequest.replaces): the coordinator hands the name
// over when that nonce holds it. A live process's heartbeat stays fresh, so
// it keeps its name; knowing its nonce takes access to the region's Redis.

// successionAfter is how old a predecessor's heartbeat must be for a
// process to take its name: twice the heartbeat's period.
const successionAfter = 2 * time.Second

// succeed is called when a request was refused because another process
// holds this instance's name. It reads that process from Redis: when its
// heartbeat has stopped it is named in the next request, which is due at
// once; otherwise the next request waits until the heartbeat would have
// gone stale, or the refusal's own delay if that comes first.
func (l *leaser) succeed(ctx context.Context) error {
	prev, beat, err := l.shared.Holder(ctx, l.instance)
	if err != nil {
		return err
	}
	if prev == "" || prev == l.nonce {
		return nil // nobody recorded: the name is held by a process from before this scheme, or by us
	}
	stale := beat.Add(successionAfter) // long past when the heartbeat is gone
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
// process as its own (regional.EdgeAgentOf).
func (l *leaser) Succession() (nonce, predecessor string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nonce, l.predecessor
}

// holds is the name publish records this process as holding: none until
// a request under it succeeded.
func (l *leaser) holds() string {
	if !l.named {
		return ""
	}
	return l.instance
}
