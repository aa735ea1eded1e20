package agent

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
)

// edgeReader is one agent's copy of what the other agents hold in the
// region's edge reservations, kept current by reading only the fields
// written since its last read (the script's log): an agent reads the
// reservations about every 250 ms, and a whole read costs Redis about
// 6 µs a field, which with many identities is most of what an idle
// region's Redis does. It reads whole at its first read, when the store
// lost its keys (a new epoch) or trimmed its log past this reader, after
// any error talking to Redis (a failover that lost the last writes shows
// as errors first, or as a log position that went back), and every
// fullEvery, which drops the entries of agents that stopped (they expire
// unwritten) and repairs anything else a failover lost. Not safe for
// concurrent use: the edge engine's rounds read one at a time.
type edgeReader struct {
	self      string // this agent's id: its own entries are not the others'
	fullEvery time.Duration
	now       func() time.Time

	epoch  string // the log's epoch, "" until a whole read
	since  int64  // the log's position read up to
	fullAt time.Time
	fields map[string][]edgeEntry // field -> the other agents' entries
	// sumsOf are the sums last returned, good while no field changed
	// (dirty) and until the earliest entry expires (sumsUntil, Redis ms).
	sumsOf    map[edgeKeyID]edge.Others
	sumsUntil int64
	dirty     bool

	wholeReads, fieldsRead int64 // what it read, in all (tests)
}

// edgeEntry is one other agent's entry for one policy identity, expiring
// at expiresMs on Redis's clock.
type edgeEntry struct{ reserved, edge, direct, expiresMs int64 }

// edgeFullEvery is how often a reader reads the whole hash anyway.
const edgeFullEvery = 30 * time.Second

func newEdgeReader(self string, now func() time.Time) *edgeReader {
	return &edgeReader{self: self, fullEvery: edgeFullEvery, now: now}
}

// read brings the copy up to date and returns the others' sums for every
// policy identity they hold something for, at Redis's clock of the read.
func (r *edgeReader) read(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent) (map[edgeKeyID]edge.Others, error) {
	var nowMs int64
	var err error
	if r.epoch == "" || r.now().Sub(r.fullAt) >= r.fullEvery {
		nowMs, err = r.readWhole(ctx, rdb, region, a)
	} else if nowMs, err = r.readLog(ctx, rdb, region, a); err == errEdgeReset {
		nowMs, err = r.readWhole(ctx, rdb, region, a)
	}
	if err != nil {
		r.reset()
		return nil, err
	}
	return r.sums(nowMs), nil
}

// reset makes the next read read whole.
func (r *edgeReader) reset() { r.epoch = "" }

var errEdgeReset = fmt.Errorf("edge reservations: the log must be read whole")

// readWhole reads the hash page by page into a new copy, positioned at
// the log as the first page found it: what changes during the read is
// logged after that, and read again with the next read.
func (r *edgeReader) readWhole(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent) (int64, error) {
	started := r.now()
	fields := map[string][]edgeEntry{}
	var epoch string
	var since, nowMs int64
	for cursor, first := "0", true; ; first = false {
		res, err := edgeCall(ctx, rdb, region, a, nil, edgeRead{mode: "full", from: cursor, page: edgePage})
		if err != nil {
			return 0, err
		}
		if first {
			epoch, since = res.epoch, res.seq
		}
		nowMs = res.nowMs
		r.fieldsRead += int64(len(res.fields))
		for _, f := range res.fields {
			r.apply(fields, f)
		}
		if cursor = res.next; cursor == "0" {
			break
		}
	}
	r.fields, r.epoch, r.since, r.fullAt, r.dirty = fields, epoch, since, started, true
	r.wholeReads++
	return nowMs, nil
}

// readLog reads the fields written since the last read, a page a call.
func (r *edgeReader) readLog(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent) (int64, error) {
	for {
		res, err := edgeCall(ctx, rdb, region, a, nil, edgeRead{mode: "log", from: strconv.FormatInt(r.since, 10), page: edgePage, epoch: r.epoch})
		if err != nil {
			return 0, err
		}
		if res.next == "reset" || res.seq < r.since {
			return 0, errEdgeReset
		}
		r.fieldsRead += int64(len(res.fields))
		r.dirty = r.dirty || len(res.fields) > 0
		for _, f := range res.fields {
			r.apply(r.fields, f)
		}
		if res.next == "0" {
			r.since = res.seq // the page held every change: read up to the call's position
			return res.nowMs, nil
		}
		if r.since, err = strconv.ParseInt(res.next, 10, 64); err != nil {
			return 0, fmt.Errorf("edge reservations: log position %q: %w", res.next, err)
		}
	}
}

// apply sets one field's other entries in fields from its value.
func (r *edgeReader) apply(fields map[string][]edgeEntry, f [2]string) {
	var es []edgeEntry
	for line := range strings.SplitSeq(f[1], "\n") {
		w := strings.Fields(line)
		if len(w) < 5 || w[0] == r.self {
			continue
		}
		var e edgeEntry
		var errs [4]error
		e.reserved, errs[0] = strconv.ParseInt(w[1], 10, 64)
		e.edge, errs[1] = strconv.ParseInt(w[2], 10, 64)
		e.direct, errs[2] = strconv.ParseInt(w[3], 10, 64)
		e.expiresMs, errs[3] = strconv.ParseInt(w[4], 10, 64)
		if errs != [4]error{} {
			continue // not an entry the script wrote
		}
		es = append(es, e)
	}
	if len(es) == 0 {
		delete(fields, f[0])
		return
	}
	fields[f[0]] = es
}

// sums are the others' entries alive at nowMs, summed by policy identity;
// the expired ones are dropped from the copy. They are summed again only
// when a field changed or an entry expired. The caller must not change
// the map.
func (r *edgeReader) sums(nowMs int64) map[edgeKeyID]edge.Others {
	if !r.dirty && r.sumsOf != nil && nowMs < r.sumsUntil {
		return r.sumsOf
	}
	out := map[edgeKeyID]edge.Others{}
	until := int64(math.MaxInt64)
	for f, es := range r.fields {
		live := es[:0]
		var o edge.Others
		for _, e := range es {
			if e.expiresMs > nowMs {
				live = append(live, e)
				o.Reserved, o.Edge, o.Direct = o.Reserved+e.reserved, o.Edge+e.edge, o.Direct+e.direct
				until = min(until, e.expiresMs)
			}
		}
		if len(live) == 0 {
			delete(r.fields, f)
			continue
		}
		r.fields[f] = live
		if k, ok := parseEdgeField(f); ok && o != (edge.Others{}) {
			out[k] = o
		}
	}
	r.sumsOf, r.sumsUntil, r.dirty = out, until, false
	return out
}
