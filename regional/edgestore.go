package regional

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/edge"
)

// The region's edge reservations in its Redis (lua/edge_sync.lua): what
// each agent process reserved of every policy identity's capacity for the
// Envoy instances it serves, with an expiry on Redis's clock so that a dead
// agent's reservation ends by itself once its assignments may have expired:
// the entry's own, or its agent's life, which every sync renews, so that
// an unchanged entry needs no rewriting.

// edgeSyncScript applies one agent's updates and reads a page of what the
// others hold (lua/edge_sync.lua).
var edgeSyncScript = script("edge_sync.lua")

// edgeKeys are the region's hash of edge reservations, the log of its
// writes, the log's counter and the agents' lives.
func (r *Region) edgeKeys() []string {
	return []string{r.Key("edge"), r.Key("edgelog"), r.Key("edgeseq"), r.Key("edgealive")}
}

// edgeField names a policy identity in the hash.
func edgeField(k edge.ID) string { return k.Policy + "\x00" + k.Identity }

func parseEdgeField(f string) (edge.ID, bool) {
	p, id, ok := strings.Cut(f, "\x00")
	return edge.ID{Policy: p, Identity: id}, ok
}

// edgeBatch is the most updates one call of the script applies, and
// edgePage the fields one call reads: a sync or a read of the whole hash is
// several short calls, so that a decision's script, which Redis runs
// between them, never waits long behind the edge (a hash of 100,000
// identities read in one call held Redis for 0.7-0.9 s; in pages of 128,
// no call took more than 10 ms: BenchmarkEdgeRead).
const edgeBatch, edgePage = 256, 128

// EdgeAgent names an agent process in the region's reservations: its ID,
// and the ID of the process it succeeded under its instance name, if any,
// whose Envoy instances reconnect to it (their places are its own).
type EdgeAgent struct{ ID, Heir string }

// EdgeAgentOf names the process of nonce, which succeeded heir ("" for
// none): a digest of each, so that whatever an instance name holds, the
// script reads one word.
func EdgeAgentOf(nonce, heir string) EdgeAgent {
	name := func(n string) string {
		if n == "" {
			return ""
		}
		d := sha256.Sum256([]byte(n))
		return hex.EncodeToString(d[:8])
	}
	return EdgeAgent{name(nonce), name(heir)}
}

// EdgeWrite applies updates for agent a, in batches, and returns, in
// order, what Redis granted each (what the others hold is EdgeStore's to
// read). The entries it writes end at their own expiry alone, whether a
// lives on or not: an agent leaving writes its last ones so.
// On an error, granted holds what the batches that landed granted, the
// first len(granted) updates, so that a sync too large for its time still
// makes progress.
func (r *Region) EdgeWrite(ctx context.Context, a EdgeAgent, updates []edge.Write) (granted []edge.Granted, err error) {
	granted, _, err = r.edgeWrite(ctx, a, 0, updates)
	return granted, err
}

// edgeWrite is EdgeWrite keeping a alive for alive more with each call
// (none when 0); life is the life its last call found a in.
func (r *Region) edgeWrite(
	ctx context.Context,
	a EdgeAgent,
	alive time.Duration,
	updates []edge.Write,
) (granted []edge.Granted, life int64, err error) {
	granted = make([]edge.Granted, 0, len(updates))
	for start := 0; start < len(updates); start += edgeBatch {
		res, err := r.edgeCall(ctx, a, alive, updates[start:min(len(updates), start+edgeBatch)], edgeRead{})
		if err != nil {
			return granted, life, err
		}
		granted, life = append(granted, res.granted...), res.life
	}
	return granted, life, nil
}

// edgeRead is the read one call of the script makes: none (mode ""), a
// page of the whole hash ("full", from an HSCAN cursor) or of the log
// ("log", from the score read up to, in epoch).
type edgeRead struct {
	mode, from, epoch string
	page              int
}

// edgeResult is one call's answer: Redis's clock (ms), the grants of its
// updates, the fields its page read (name and value, "" for nothing of
// the other agents'), where to go on (next: "0" when done, "reset" when a
// log read must read whole), the log's epoch and position after the
// call, with a read, each live agent's life, and the caller's life (its
// start, 0 for none).
type edgeResult struct {
	nowMs       int64
	granted     []edge.Granted
	fields      [][2]string
	next, epoch string
	seq, life   int64
	lives       map[string]edgeLife
}

// edgeLife is one life of an agent process: until when it lives, and
// when it began, which names it (Redis ms).
type edgeLife struct{ until, start int64 }

// edgeCall is one call of the script: a kept alive for alive more (none
// when 0; its updates are then not bound to its life), updates applied,
// then rd's page.
func (r *Region) edgeCall(
	ctx context.Context,
	a EdgeAgent,
	alive time.Duration,
	updates []edge.Write,
	rd edgeRead,
) (edgeResult, error) {
	args := make([]any, 0, 8+9*len(updates))
	args = append(args, a.ID, a.Heir, max(0, alive.Milliseconds()), len(updates))
	for _, u := range updates {
		args = append(args, edgeField(u.ID), u.Want, u.Capacity, u.EdgeDemand, u.Direct,
			max(1, u.Life.Milliseconds()), u.Instances, u.Most, u.Largest)
	}
	args = append(args, rd.mode, rd.from, rd.page, rd.epoch)
	res, err := edgeSyncScript.Run(ctx, r.rdb, r.edgeKeys(), args...).Slice()
	if err != nil {
		return edgeResult{}, fmt.Errorf("edge reservations: %w", err)
	}
	if len(res) != 8 {
		return edgeResult{}, fmt.Errorf("edge reservations: %d results, want 8", len(res))
	}
	var out edgeResult
	gs, _ := res[1].([]any)
	fs, _ := res[2].([]any)
	out.next, _ = res[3].(string)
	out.epoch, _ = res[4].(string)
	ls, _ := res[6].([]any)
	if len(gs) != edgeGrantWidth*len(updates) || len(fs)%2 != 0 || len(ls)%2 != 0 {
		return edgeResult{}, fmt.Errorf("edge reservations: %d grants for %d updates, %d field values, %d lives",
			len(gs), len(updates), len(fs), len(ls))
	}
	var errs [5]error
	out.nowMs, errs[0] = edgeInt(res[0])
	out.seq, errs[1] = edgeInt(res[5])
	out.life, errs[4] = edgeInt(res[7])
	out.granted = make([]edge.Granted, len(updates))
	for i := range out.granted {
		var n [edgeGrantWidth]int64
		for j := range n {
			var err error
			n[j], err = edgeInt(gs[edgeGrantWidth*i+j])
			errs[2] = errors.Join(errs[2], err)
		}
		out.granted[i] = edge.Granted{Reserved: n[0], Places: n[1], Inherited: edge.Inheritance{
			Reserved: n[2], Largest: n[3], Places: n[4], Left: time.Duration(n[5]) * time.Millisecond, Edge: n[6], Direct: n[7]}}
	}
	out.lives = make(map[string]edgeLife, len(ls)/2)
	for i := 0; i < len(ls); i += 2 {
		who, _ := ls[i].(string)
		v, _ := ls[i+1].(string)
		var l edgeLife
		if _, err := fmt.Sscanf(v, "%d %d", &l.until, &l.start); err != nil {
			errs[3] = fmt.Errorf("edge reservations: agent %q's life %q: %w", who, v, err)
		}
		out.lives[who] = l
	}
	if err := errors.Join(errs[:]...); err != nil {
		return edgeResult{}, err
	}
	out.fields = make([][2]string, len(fs)/2)
	for i := range out.fields {
		f, ok1 := fs[2*i].(string)
		v, ok2 := fs[2*i+1].(string)
		if !ok1 || !ok2 {
			return edgeResult{}, fmt.Errorf("edge reservations: field %d is not a string", i)
		}
		out.fields[i] = [2]string{f, v}
	}
	return out, nil
}

// edgeGrantWidth is the numbers the script answers per update: the
// reservation and places granted, and what moved from the process
// succeeded (edge.Inheritance).
const edgeGrantWidth = 8

func edgeInt(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("edge reservations: %T where a number was expected", v)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("edge reservations: %w", err)
	}
	return n, nil
}

// EdgeStore is one agent process's side of the region's edge reservations
// as its edge rounds sync with them (edge.Store): its writes (EdgeWrite)
// and its copy of what the other agents hold (edgeReader). Not safe for
// concurrent use: the rounds sync one at a time.
type EdgeStore struct {
	r        *Region
	self     func() EdgeAgent // this agent process, and the one it succeeded
	now      func() time.Time
	trust    time.Duration // the most a read may take (edge.Config.Trust)
	growWait time.Duration // the most the writes may take after it
	reader   *edgeReader   // made at the first sync, for this agent's id
}

var _ edge.Store = (*EdgeStore)(nil)

// EdgeStore returns the edge reservations as the agent process self names
// syncs with them: a read may take trust, the writes growWait after it.
func (r *Region) EdgeStore(self func() EdgeAgent, now func() time.Time, trust, growWait time.Duration) *EdgeStore {
	return &EdgeStore{r: r, self: self, now: now, trust: trust, growWait: growWait}
}

// Sync reads the other agents' reservations when read, then writes
// writes, each call keeping this agent alive for alive more (its entries
// bound to that life). The read may take as long as it may be trusted
// (edge.Config.Trust: it counts from when it was sent); the writes get
// growWait after it. A read that found no copy to serve from, its sweep of
// the whole hash going on at the next, returns ErrEdgeSweeping. The
// answer's Life is the life the last call that reached Redis found this
// agent in, on an error too (0 when none did): those calls kept it alive.
func (s *EdgeStore) Sync(
	ctx context.Context,
	writes []edge.Write,
	read bool,
	alive time.Duration,
) (edge.SyncAnswer, error) {
	agent := s.self()
	if s.reader == nil {
		s.reader = newEdgeReader(agent.ID, s.now)
	}
	// The read first: it is trusted from when it was sent, so however long
	// the writes take, it does not age while they run (the script's growth
	// rule counts whatever the others wrote since).
	var others map[edge.ID]edge.Others
	var readErr error
	s.reader.life = 0
	if read {
		rctx, cancel := context.WithTimeout(ctx, s.trust)
		others, readErr = s.reader.read(rctx, s.r, agent, alive)
		cancel()
	}
	wctx, cancel := context.WithTimeout(ctx, s.growWait)
	granted, life, err := s.r.edgeWrite(wctx, agent, alive, writes)
	cancel()
	if life == 0 {
		life = s.reader.life
	}
	if err = errors.Join(err, readErr); err != nil {
		return edge.SyncAnswer{Granted: granted, Life: life}, err
	}
	return edge.SyncAnswer{Granted: granted, Others: others, Life: life}, nil
}
