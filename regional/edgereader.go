package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/edge"
)

// edgeReader is one agent's copy of what the other agents hold in the
// region's edge reservations, kept current by reading only the fields
// written since its last read (the script's log): an agent reads the
// reservations about every 250 ms, and a whole read costs Redis about
// 6 µs a field, which with many identities is most of what an idle
// region's Redis does.
//
// It also reads the whole hash, a sweep: at its first read, when the store
// lost its keys (a new epoch), trimmed its log past this reader or went
// back in it (a failover that lost the last writes), after an error
// talking to Redis other than a timeout (a failover shows as errors
// first), and every fullEvery, which drops the entries of agents that stopped
// (their lives ended) and repairs anything else a failover lost. A
// sweep goes a few pages a read while a copy serves, the log's changes
// going into both, and replaces the copy when done; without a copy it
// reads as many pages as a read's time allows, and the reads return
// ErrEdgeSweeping until it is done. So no read outlasts its time however
// large the hash. Not safe for concurrent use: the edge engine's rounds
// read one at a time.
type edgeReader struct {
	self      string // this agent's id: its own entries are not the others'
	fullEvery time.Duration
	now       func() time.Time

	epoch  string // the log's epoch, "" until a sweep began
	since  int64  // the log's position read up to
	fullAt time.Time
	fields map[string][]edgeEntry // field -> the other agents' entries; nil until a sweep ends

	// The sweep under way (sweep not nil): the next HSCAN cursor, when it
	// began, and what it read.
	sweep   map[string][]edgeEntry
	cursor  string
	sweepAt time.Time

	// lives is each live agent's life, as last read: the entries written
	// in one end with it. life is this agent's, as its last call found it
	// (its user clears it to learn whether a read reached Redis).
	lives map[string]edgeLife
	life  int64

	// sumsOf are the sums last returned, good while no field changed
	// and no life was cut short (dirty), and until the earliest entry
	// ends (sumsUntil, Redis ms).
	sumsOf    map[edge.ID]edge.Others
	sumsUntil int64
	dirty     bool

	wholeReads, fieldsRead int64 // what it read, in all (tests)
}

// edgeEntry is one other agent's entry for one policy identity, expiring
// at expiresMs on Redis's clock, or with the life of its agent (who) it
// was written in (life, its start; 0 for none), if sooner.
type edgeEntry struct {
	reserved, edge, direct, expiresMs int64
	who                               string
	life                              int64
}

// ends is when e stops counting, given the agents' lives.
func (e edgeEntry) ends(lives map[string]edgeLife) int64 {
	if e.life == 0 {
		return e.expiresMs
	}
	if l := lives[e.who]; l.start == e.life {
		return min(e.expiresMs, l.until)
	}
	return 0 // a life over (not recorded), or not its agent's last
}

// edgeFullEvery is how often a reader sweeps the whole hash anyway, and
// edgeSweepPages how many pages a read adds to a sweep while a copy
// serves (2,048 fields: about 12 ms of Redis).
const (
	edgeFullEvery  = 30 * time.Second
	edgeSweepPages = 16
)

func newEdgeReader(self string, now func() time.Time) *edgeReader {
	return &edgeReader{self: self, fullEvery: edgeFullEvery, now: now}
}

// ErrEdgeSweeping is what a read returns while an EdgeStore has no copy
// of the others' reservations yet: its sweep of the whole hash goes on
// with the next read. It is not a failure of Redis.
var ErrEdgeSweeping = errors.New("edge reservations: still reading the region's reservations whole")

var errEdgeReset = errors.New("edge reservations: the log must be read whole")

// read brings the copy up to date and returns the others' sums for every
// policy identity they hold something for, at Redis's clock of the read.
func (r *edgeReader) read(
	ctx context.Context,
	rg *Region,
	a EdgeAgent,
	alive time.Duration,
) (map[edge.ID]edge.Others, error) {
	nowMs, err := r.step(ctx, rg, a, alive)
	if errors.Is(err, errEdgeReset) {
		r.reset()
		nowMs, err = r.step(ctx, rg, a, alive)
	}
	switch {
	case err != nil && timedOut(err):
		return nil, err // too slow: the log and the sweep go on from where they were
	case err != nil:
		// Redis may have failed over and lost the last writes: the copy
		// still holds what it read, at least what the agents use, and a
		// sweep, begun now, repairs what it missed.
		r.fullAt = time.Time{}
		return nil, err
	}
	if r.fields == nil {
		return nil, ErrEdgeSweeping
	}
	return r.sums(nowMs), nil
}

// timedOut reports whether err is a read that ran out of its time (the
// context's deadline, or the connection's, which go-redis sets from it).
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// reset drops the copy: the next read sweeps the hash whole. A store that
// lost its keys or its log holds entries written since that the copy
// lacks, and the log cannot say which.
func (r *edgeReader) reset() {
	r.epoch, r.fields, r.sweep = "", nil, nil
}

// step reads the log (once a sweep began), then goes on with a sweep,
// beginning one when due; it returns Redis's clock at the last call.
func (r *edgeReader) step(ctx context.Context, rg *Region, a EdgeAgent, alive time.Duration) (int64, error) {
	var nowMs int64
	if r.epoch != "" {
		n, err := r.readLog(ctx, rg, a, alive)
		if err != nil {
			return 0, err
		}
		nowMs = n
	}
	// Without an epoch (nothing was written yet when the sweep began)
	// there is no log to read: sweep again until there is.
	if r.sweep == nil && (r.fields == nil || r.epoch == "" || r.now().Sub(r.fullAt) >= r.fullEvery) {
		r.sweep, r.cursor, r.sweepAt = map[string][]edgeEntry{}, "0", r.now()
	}
	if r.sweep == nil {
		return nowMs, nil
	}
	pages := edgeSweepPages
	if r.fields == nil {
		pages = math.MaxInt // no copy serves: as far as the read's time allows
	}
	for ; pages > 0; pages-- {
		res, err := rg.edgeCall(ctx, a, alive, nil, edgeRead{mode: "full", from: r.cursor, page: edgePage})
		if err != nil {
			return 0, err
		}
		r.setLives(res)
		switch first := r.cursor == "0"; {
		case first && r.epoch == "":
			// The sweep's first page: the log from here on is read into it,
			// as what changes after this call is logged after res.seq.
			r.epoch, r.since = res.epoch, res.seq
		case res.epoch != r.epoch:
			return 0, errEdgeReset // the store lost its keys, or its first write came during the sweep
		}
		nowMs = res.nowMs
		r.fieldsRead += int64(len(res.fields))
		for _, f := range res.fields {
			r.apply(r.sweep, f)
		}
		if r.cursor = res.next; r.cursor == "0" {
			r.fields, r.sweep, r.fullAt, r.dirty = r.sweep, nil, r.sweepAt, true
			r.wholeReads++
			break
		}
	}
	return nowMs, nil
}

// readLog reads the fields written since the last read, a page a call,
// into the copy and the sweep under way.
func (r *edgeReader) readLog(ctx context.Context, rg *Region, a EdgeAgent, alive time.Duration) (int64, error) {
	for {
		rd := edgeRead{mode: "log", from: strconv.FormatInt(r.since, 10), page: edgePage, epoch: r.epoch}
		res, err := rg.edgeCall(ctx, a, alive, nil, rd)
		if err != nil {
			return 0, err
		}
		r.setLives(res)
		if res.next == "reset" || res.seq < r.since {
			return 0, errEdgeReset
		}
		r.fieldsRead += int64(len(res.fields))
		r.dirty = r.dirty || len(res.fields) > 0
		for _, f := range res.fields {
			if r.fields != nil {
				r.apply(r.fields, f)
			}
			if r.sweep != nil {
				r.apply(r.sweep, f)
			}
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

// setLives keeps the agents' lives a read's call res found, and this
// agent's. Lives only grow while their agents call; one cut short or
// begun again (the store lost it, the agent was paused) makes the sums
// stale, as an entry may end sooner than they were kept for.
func (r *edgeReader) setLives(res edgeResult) {
	for who, l := range r.lives {
		if n := res.lives[who]; n.start != l.start || n.until < l.until {
			r.dirty = true
			break
		}
	}
	r.lives, r.life = res.lives, res.life
}

// apply sets one field's other entries in fields from its value.
func (r *edgeReader) apply(fields map[string][]edgeEntry, f [2]string) {
	var es []edgeEntry
	for line := range strings.SplitSeq(f[1], "\n") {
		w := strings.Fields(line)
		if len(w) < 5 || w[0] == r.self {
			continue
		}
		e := edgeEntry{who: w[0]}
		if len(w) > 7 {
			e.life, _ = strconv.ParseInt(w[7], 10, 64)
		}
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
// the ended ones are dropped from the copy. They are summed again only
// when a field changed, an entry ended or a life was cut short. The caller must not change
// the map.
func (r *edgeReader) sums(nowMs int64) map[edge.ID]edge.Others {
	if !r.dirty && r.sumsOf != nil && nowMs < r.sumsUntil {
		return r.sumsOf
	}
	out := map[edge.ID]edge.Others{}
	until := int64(math.MaxInt64)
	for f, es := range r.fields {
		live := es[:0]
		var o edge.Others
		for _, e := range es {
			if end := e.ends(r.lives); end > nowMs {
				live = append(live, e)
				o.Reserved, o.Edge, o.Direct = o.Reserved+e.reserved, o.Edge+e.edge, o.Direct+e.direct
				until = min(until, end)
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
