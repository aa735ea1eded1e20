package regional

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Region is what a region's agent processes keep in its Redis beside the
// counters the Engine decides on, and the one owner of those keys:
//
//	ql:policies:{<region>}   the policy set last loaded from the coordinator (JSON)
//	ql:grants:{<region>}     hash: quota -> the grant an agent last installed (SavedGrant)
//	ql:agents:{<region>}     hash: presence, each process's heartbeat and demand per quota
//	ql:instances:{<region>}  hash: instance name -> nonce of the process holding it
//	ql:edge:{<region>}       hash: the edge reservations (lua/edge_sync.lua)
//	ql:edgelog:{<region>}    sorted set: the log of the reservations' writes
//	ql:edgeseq:{<region>}    hash: the log's counter and epoch
//	ql:edgealive:{<region>}  hash: agent id -> its life, until when and since when (ms)
//
// Each key carries the region as its hash tag, so on Redis Cluster a
// region's keys share one slot and a script may touch all of them. Saved
// times are wall-clock Unix milliseconds, the only clock two processes
// share; the edge reservations expire on Redis's own clock. Safe for
// concurrent use, as the client is; the EdgeStore it makes is not.
type Region struct {
	rdb  redis.UniversalClient
	name string
}

// NewRegion returns the shared state of region name in rdb.
func NewRegion(rdb redis.UniversalClient, name string) *Region {
	return &Region{rdb: rdb, name: name}
}

// Name is the region's name.
func (r *Region) Name() string { return r.name }

// Key is the region's key of one kind ("grants", "edge", ...: the layout
// above), for tests and operators inspecting the store.
func (r *Region) Key(kind string) string { return "ql:" + kind + ":{" + r.name + "}" }

// savedTTL is how long a region's saved state outlives its last write: a
// region whose agents are all gone for longer starts as a new one.
const savedTTL = 7 * 24 * time.Hour
