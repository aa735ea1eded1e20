package agent

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

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/edge"
)

// The region's edge reservations in its Redis (lua/edge_sync.lua): what
// each agent process reserved of every policy identity's capacity for the
// Envoy instances it serves, with an expiry on Redis's clock so that a dead
// agent's reservation ends by itself once its assignments may have expired.

//go:embed lua/edge_sync.lua
var edgeSyncLua string

var edgeSyncScript = redis.NewScript(edgeSyncLua)

// edgeReservationsKey is the region's hash of edge reservations;
// edgeLogKey the log of its writes and edgeSeqKey the log's counter
// (lua/edge_sync.lua). The three share a hash slot on Redis Cluster.
func edgeReservationsKey(region string) string { return "ql:edge:{" + region + "}" }
func edgeLogKey(region string) string          { return "ql:edgelog:{" + region + "}" }
func edgeSeqKey(region string) string          { return "ql:edgeseq:{" + region + "}" }

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

// edgeAgent names an agent process in the region's reservations: its id,
// and the id of the process it succeeded under its instance name, if any,
// whose Envoy instances reconnect to it (their places are its own).
type edgeAgent struct{ id, heir string }

// edgeAgentOf names the process of nonce, which succeeded heir ("" for
// none): a digest of each, so that whatever an instance name holds, the
// script reads one word.
func edgeAgentOf(nonce, heir string) edgeAgent {
	name := func(n string) string {
		if n == "" {
			return ""
		}
		d := sha256.Sum256([]byte(n))
		return hex.EncodeToString(d[:8])
	}
	return edgeAgent{name(nonce), name(heir)}
}

// edgeWrite applies updates for agent a, in batches, and returns, in
// order, what Redis granted each (what the others hold is edgeReader's).
// On an error, granted holds what the batches that landed granted, the
// first len(granted) updates, so that a sync too large for its time still
// makes progress.
func edgeWrite(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent, updates []edge.Write) (granted []edge.Granted, err error) {
	granted = make([]edge.Granted, 0, len(updates))
	for start := 0; start < len(updates); start += edgeBatch {
		res, err := edgeCall(ctx, rdb, region, a, updates[start:min(len(updates), start+edgeBatch)], edgeRead{})
		if err != nil {
			return granted, err
		}
		granted = append(granted, res.granted...)
	}
	return granted, nil
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
// log read must read whole), and the log's epoch and position after the
// call.
type edgeResult struct {
	nowMs       int64
	granted     []edge.Granted
	fields      [][2]string
	next, epoch string
	seq         int64
}

// edgeCall is one call of the script: updates applied, then rd's page.
func edgeCall(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent, updates []edge.Write, rd edgeRead) (edgeResult, error) {
	args := make([]any, 0, 7+9*len(updates))
	args = append(args, a.id, a.heir, len(updates))
	for _, u := range updates {
		args = append(args, edgeField(u.ID), u.Want, u.Capacity, u.EdgeDemand, u.Direct, max(1, u.Life.Milliseconds()), u.Instances, u.Most, u.Largest)
	}
	args = append(args, rd.mode, rd.from, rd.page, rd.epoch)
	keys := []string{edgeReservationsKey(region), edgeLogKey(region), edgeSeqKey(region)}
	res, err := edgeSyncScript.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return edgeResult{}, fmt.Errorf("edge reservations: %w", err)
	}
	if len(res) != 6 {
		return edgeResult{}, fmt.Errorf("edge reservations: %d results, want 6", len(res))
	}
	var out edgeResult
	gs, _ := res[1].([]any)
	fs, _ := res[2].([]any)
	out.next, _ = res[3].(string)
	out.epoch, _ = res[4].(string)
	if len(gs) != edgeGrantWidth*len(updates) || len(fs)%2 != 0 {
		return edgeResult{}, fmt.Errorf("edge reservations: %d grants for %d updates, %d field values", len(gs), len(updates), len(fs))
	}
	var errs [3]error
	out.nowMs, errs[0] = edgeInt(res[0])
	out.seq, errs[1] = edgeInt(res[5])
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
