package regional

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/policy"
)

// decision is one request resolved to its part of a decideScript call: its
// keys and its six arguments, laid out as decide.lua reads them.
type decision struct {
	policy string
	keys   []string
	args   [6]any
	// counted marks a fixed-window decision the engine makes without the
	// script, on its window's counter (window.go), with these limits and
	// cost in micro-units. The keys and arguments still describe it, for
	// the script to decide it when it has to.
	counted                  bool
	capacity, windowMs, cost int64
	alg                      policy.Algorithm
	ret                      bool // a return (admission.Ticket.Return)
	postHoc                  bool // counted whether or not it fits (policy.Limits.PostHoc)
}

// decided is the outcome of one decision.
type decided struct {
	d   policy.Decision
	err error
}

// maxScriptDecisions bounds the decisions of one script call: a script
// holds Redis for its whole run (about 15 µs a decision), so a long batch
// is split rather than stall every other client for milliseconds.
const maxScriptDecisions = 32

// decide decides ds in as few round trips as it can: with counted fixed
// windows among them, as decideCounted does; else as decideScripts.
func (e *Engine) decide(ctx context.Context, ds []decision) []decided {
	for i := range ds {
		if ds[i].counted {
			return e.decideCounted(ctx, ds)
		}
	}
	return e.decideScripts(ctx, ds)
}

// decideScripts runs ds in as few script calls as it can, sent as one round
// trip: one call per group of up to maxScriptDecisions, and on a cluster per
// hash slot, since a script may only touch the keys of one slot. Decisions
// keep their order within a slot, which is all that matters: decisions in
// different slots share no key. Every decision gets its own outcome.
func (e *Engine) decideScripts(ctx context.Context, ds []decision) []decided {
	groups := e.group(ds)
	now, floor := e.scriptNow()
	out := make([]decided, len(ds))
	if len(groups) == 1 { // the usual case: one call, no pipeline to build
		c := callOf(ds, groups[0], now, floor, e.cfg.ReservationTTL.Milliseconds())
		e.read(decideScript.Run(ctx, e.rdb, c.keys, c.args...), ds, groups[0], out)
		e.raiseFloor(ds, groups[0], out, now)
		return out
	}
	calls := make([]scriptCall, len(groups))
	for i, g := range groups {
		calls[i] = callOf(ds, g, now, floor, e.cfg.ReservationTTL.Milliseconds())
	}
	for i, cmd := range runPipelined(ctx, e.rdb, decideScript, calls) {
		e.read(cmd, ds, groups[i], out)
		e.raiseFloor(ds, groups[i], out, now)
	}
	return out
}

// scriptNow returns the time and floor arguments of a script call (nowArg;
// redisClock): the script decides fixed windows at that time or the floor,
// whichever is later.
func (e *Engine) scriptNow() (string, int64) {
	return e.nowArg(), e.clk.floor()
}

// raiseFloor raises the engine's floor to the time the script decided the
// fixed windows among the decisions g of ds at, from their outcomes, when
// that time is the injected clock's (now): as a charge, or a return to a
// window that holds something (a return to nothing writes nothing, and
// leaves the time as it was). On the server's clock only the counted
// decisions' TIME readings raise it.
func (e *Engine) raiseFloor(ds []decision, g []int, out []decided, now string) {
	if now == "" {
		return
	}
	ms, err := strconv.ParseInt(now, 10, 64)
	if err != nil {
		return
	}
	for _, j := range g {
		if ds[j].alg == policy.FixedWindow && out[j].err == nil && (!ds[j].ret || out[j].d.ResetAfterMs > 0) {
			e.clk.raise(ms)
			return
		}
	}
}

// callOf lays out the decisions g of ds as one decideScript call, at now
// (scriptNow) with the engine's fixed-window floor and reservations living
// rsvMs.
func callOf(ds []decision, g []int, now string, floor, rsvMs int64) scriptCall {
	c := scriptCall{keys: ds[g[0]].keys, args: make([]any, 0, 3+len(g)*len(ds[0].args))}
	if len(g) > 1 {
		c.keys = nil
		for _, j := range g {
			c.keys = append(c.keys, ds[j].keys...)
		}
	}
	c.args = append(c.args, now, floor, rsvMs)
	for _, j := range g {
		c.args = append(c.args, ds[j].args[:]...)
	}
	return c
}

// read hands the decisions g of ds their outcomes from cmd, the reply of
// their script call, in out.
func (e *Engine) read(cmd *redis.Cmd, ds []decision, g []int, out []decided) {
	replies, err := cmd.Slice()
	if err == nil && len(replies) != len(g) {
		err = fmt.Errorf("decision script returned %d replies for %d decisions", len(replies), len(g))
	}
	for k, j := range g {
		if err != nil {
			out[j].err = err
			continue
		}
		out[j].d, out[j].err = parseDecision(replies[k])
	}
}

// inOrder[n] groups n decisions into one call, in order: shared by every
// engine and never modified, so the usual grouping allocates nothing.
var inOrder = func() (g [maxScriptDecisions + 1][][]int) {
	var all [maxScriptDecisions]int
	for i := range all {
		all[i] = i
	}
	for n := range g {
		g[n] = [][]int{all[:n:n]}
	}
	return g
}()

// group splits the indexes of ds into the script calls that decide them.
func (e *Engine) group(ds []decision) [][]int {
	if e.cluster == nil && len(ds) <= maxScriptDecisions {
		return inOrder[len(ds)]
	}
	all := make([]int, len(ds))
	for i := range all {
		all[i] = i
	}
	return e.groupOf(ds, all)
}

// groupOf splits the decisions idx of ds (in order) into script calls: up
// to maxScriptDecisions each, and on a cluster one hash slot each.
func (e *Engine) groupOf(ds []decision, idx []int) [][]int {
	var groups [][]int
	if e.cluster == nil {
		for i := 0; i < len(idx); i += maxScriptDecisions {
			groups = append(groups, idx[i:min(len(idx), i+maxScriptDecisions):min(len(idx), i+maxScriptDecisions)])
		}
		return groups
	}
	open := map[int]int{} // slot -> index of its group still taking decisions
	for _, i := range idx {
		slot := KeySlot(ds[i].keys[0])
		g, ok := open[slot]
		if !ok || len(groups[g]) == maxScriptDecisions {
			g = len(groups)
			groups = append(groups, nil)
			open[slot] = g
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// parseDecision reads one decision's reply (decide.lua): five integers
// (seven for a return: what it matched and freed), the remaining negative
// for a key over its limit (its Debt), or the reason it failed.
func parseDecision(v any) (policy.Decision, error) {
	switch v := v.(type) {
	case string:
		return policy.Decision{}, errors.New(v)
	case []any:
		if len(v) != 5 && len(v) != 7 {
			return policy.Decision{}, fmt.Errorf("decision script returned %d values, want 5 or 7", len(v))
		}
		var n [7]int64
		for i, x := range v {
			var ok bool
			if n[i], ok = x.(int64); !ok {
				return policy.Decision{}, fmt.Errorf("decision script returned %T, want an integer", x)
			}
		}
		return policy.Decision{
			Allowed:      n[0] == 1,
			Remaining:    max(0, n[1]),
			Debt:         max(0, -n[1]),
			RetryAfterMs: n[2],
			ResetAfterMs: n[3],
			Replayed:     n[4] == 1,
			Matched:      n[5],
			Freed:        n[6],
		}, nil
	default:
		return policy.Decision{}, fmt.Errorf("decision script returned %T, want a reply or a reason", v)
	}
}

// scriptCall is one run of a script: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined runs calls of s as one pipeline with EVALSHA (a single call
// as a plain EVALSHA); if Redis did not know s yet, the calls are sent
// again with its source, which also loads it.
func runPipelined(ctx context.Context, rdb Client, s *redis.Script, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 1 { // no pipeline to build for one call
		cmds[0] = s.Run(ctx, rdb, calls[0].keys, calls[0].args...)
		return cmds
	}
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = s.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var retry []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe := rdb.Pipeline()
		for _, i := range retry {
			cmds[i] = s.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	return cmds
}
