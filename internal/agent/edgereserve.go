package agent

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

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

// edgeReservationsKey is the region's hash of edge reservations (one hash
// slot on Redis Cluster).
func edgeReservationsKey(region string) string { return "ql:edge:{" + region + "}" }

// edgeField names a policy identity in the hash.
func edgeField(k edgeKeyID) string { return k.policy + "\x00" + k.identity }

func parseEdgeField(f string) (edgeKeyID, bool) {
	p, id, ok := strings.Cut(f, "\x00")
	return edgeKeyID{p, id}, ok
}

// edgeUpdate is one agent's reservation for one policy identity: Want is
// granted up to Capacity counting the other agents' (growth only; a
// smaller want is granted whole: edge.Reserve, the script's rule), with
// this agent's demands, kept for Life.
type edgeUpdate struct {
	key edgeKeyID
	edge.Update
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

// edgeSync applies updates for agent a and returns, in order, what Redis
// granted each; when read, also what the other agents hold for every
// policy identity any of them holds something for (nil when not read),
// read page by page after the updates. ctx bounds the updates; readCtx
// the read. On an error, granted holds what the batches that landed
// granted, the first len(granted) updates, so that a sync too large for
// its time still makes progress.
func edgeSync(ctx, readCtx context.Context, rdb redis.UniversalClient, region string, a edgeAgent, updates []edgeUpdate, read bool) (granted []edge.Granted, others map[edgeKeyID]edge.Others, err error) {
	granted = make([]edge.Granted, 0, len(updates))
	for start := 0; start < len(updates); start += edgeBatch {
		g, _, _, err := edgeCall(ctx, rdb, region, a, updates[start:min(len(updates), start+edgeBatch)], "", 0)
		if err != nil {
			return granted, nil, err
		}
		granted = append(granted, g...)
	}
	if !read {
		return granted, nil, nil
	}
	others = map[edgeKeyID]edge.Others{}
	for cursor := "0"; ; {
		_, sums, next, err := edgeCall(readCtx, rdb, region, a, nil, cursor, edgePage)
		if err != nil {
			return granted, nil, err
		}
		maps.Copy(others, sums)
		if cursor = next; cursor == "0" {
			return granted, others, nil
		}
	}
}

// edgeCall is one call of the script: updates applied, and when cursor is
// not "", one page of about page fields read from it, with the next cursor.
func edgeCall(ctx context.Context, rdb redis.UniversalClient, region string, a edgeAgent, updates []edgeUpdate, cursor string, page int) (granted []edge.Granted, others map[edgeKeyID]edge.Others, next string, err error) {
	args := make([]any, 0, 5+8*len(updates))
	args = append(args, a.id, a.heir, len(updates))
	for _, u := range updates {
		args = append(args, edgeField(u.key), u.Want, u.Capacity, u.EdgeDemand, u.Direct, max(1, u.Life.Milliseconds()), u.Instances, u.Most)
	}
	args = append(args, cursor, page)
	res, err := edgeSyncScript.Run(ctx, rdb, []string{edgeReservationsKey(region)}, args...).Slice()
	if err != nil {
		return nil, nil, "", fmt.Errorf("edge reservations: %w", err)
	}
	if len(res) != 4 {
		return nil, nil, "", fmt.Errorf("edge reservations: %d results, want 4", len(res))
	}
	gs, _ := res[1].([]any)
	sums, _ := res[2].([]any)
	next, _ = res[3].(string)
	if len(gs) != 2*len(updates) || len(sums)%4 != 0 {
		return nil, nil, "", fmt.Errorf("edge reservations: %d grants for %d updates, %d sums", len(gs), len(updates), len(sums))
	}
	granted = make([]edge.Granted, len(updates))
	for i := range granted {
		var e1, e2 error
		granted[i].Reserved, e1 = edgeInt(gs[2*i])
		granted[i].Places, e2 = edgeInt(gs[2*i+1])
		if err := errors.Join(e1, e2); err != nil {
			return nil, nil, "", err
		}
	}
	others = make(map[edgeKeyID]edge.Others, len(sums)/4)
	for i := 0; i < len(sums); i += 4 {
		f, _ := sums[i].(string)
		k, ok := parseEdgeField(f)
		if !ok {
			continue // not ours to read
		}
		var o edge.Others
		var e1, e2, e3 error
		o.Reserved, e1 = edgeInt(sums[i+1])
		o.Edge, e2 = edgeInt(sums[i+2])
		o.Direct, e3 = edgeInt(sums[i+3])
		if e1 != nil || e2 != nil || e3 != nil {
			return nil, nil, "", fmt.Errorf("edge reservations: field %q: bad sums", f)
		}
		others[k] = o
	}
	return granted, others, next, nil
}

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
