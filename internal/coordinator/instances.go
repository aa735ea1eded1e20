package coordinator

import (
	"sync"
	"time"
)

// instanceClaims keeps which agent process (nonce) holds each instance
// name of a region. A process holds its name for as long as the grants it
// was last answered may be valid: a new nonce for a name whose process
// still renews is refused, so one Lease call cannot evict a live agent
// (before, the newest nonce won and the live agent was refused as a
// duplicate). A restarted agent gets its name back once the previous
// process's last grant has ended, or at once when it names the nonce that
// holds the name (LeaseRequest.replaces): the agent reads that nonce from
// its region's Redis once the process's heartbeat there has stopped, and
// only the region's own processes can read it. The book still counts the
// old process's outstanding grants, and refuses it as a duplicate if it
// comes back. A certificate that names its instance
// (spiffe://<domain>/region/<r>/instance/<i>) ties the name to a key on
// top of this.
//
// Claims live with one leadership term: a new leader starts with none, and
// the first process to renew under a name after a failover holds it. The
// ledger is no help there, since it records the process that last raised a
// region's mark, not the one alive.
type instanceClaims struct {
	// hold is how long a claim outlives its process's last call: the
	// validity of a grant answering it.
	hold time.Duration

	mu    sync.Mutex
	by    map[instanceKey]instanceClaim
	sweep int // prune expired claims when the map reaches this size
}

type instanceKey struct{ region, instance string }

type instanceClaim struct {
	nonce string
	until time.Duration // monotonic reading (clock.Clock.Mono)
}

// minSweep is the map size below which expired claims are left in place.
const minSweep = 64

func newInstanceClaims(hold time.Duration) *instanceClaims {
	return &instanceClaims{hold: hold, by: map[instanceKey]instanceClaim{}, sweep: minSweep}
}

// take claims region's instance for the process nonce at now (a monotonic
// reading), or renews its claim; replaces ("" for none) is the process the
// caller succeeds. It returns false and how long the name stays held when
// another process holds it.
func (c *instanceClaims) take(
	region, instance, nonce, replaces string,
	now time.Duration,
) (ok bool, heldFor time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := instanceKey{region, instance}
	if cur, held := c.by[k]; held && cur.nonce != nonce && cur.nonce != replaces && now < cur.until {
		return false, cur.until - now
	}
	c.by[k] = instanceClaim{nonce: nonce, until: now + c.hold}
	if len(c.by) >= c.sweep {
		for k, v := range c.by {
			if now >= v.until {
				delete(c.by, k)
			}
		}
		c.sweep = max(minSweep, 2*len(c.by))
	}
	return true, 0
}
