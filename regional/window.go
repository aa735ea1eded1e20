package regional

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/policy"
)

// Fixed windows without the script.
//
// What a decision script costs Redis is the Lua interpreter's, not its
// commands' (docs/benchmarks.md), and a fixed window needs no script: each
// window of a key has a counter of its own (counterKey), the same the
// script's fixed_window keeps. A fixed-window decision without an
// idempotency key is charged to its window's counter with INCRBY, which
// gets its TTL with PEXPIRE NX, in one pipeline with the call's other
// decisions, after the birth markers of their slots and between two reads
// of the server clock:
//
//	TIME, GET <marker>, INCRBY <counter> <cost>, PEXPIRE <counter> <ttl> NX, ..., TIME
//
// The engine picks the window from its estimate of the server clock
// (redisClock) and settles each decision from the replies (settleWindow):
// admitted if the counter, less the charges of this call's earlier
// rejected decisions on it, holds its cost within the capacity; else
// rejected, and its charge taken back (DECRBY) in a second round trip that
// the caller waits for, so a rejection is never charged. A decision whose
// two clock readings are not both in the window it was sent for ran
// outside it: its charge is taken back and the script, which reads the
// clock itself, decides it again. So every charge that stands was made in
// its window on the server's clock, as with the script; and a store that
// lost its memory is found by the marker's GET as the script finds it.
//
// What differs from a script (docs/regional.md): until a rejected charge
// is taken back the counter holds more than was admitted, so a concurrent
// decision may be refused that a serial order would admit (only one of
// smaller cost, or under a larger limit, than a rejected one: with equal
// costs and limits the admissions are exactly the script's); and the time
// below which no decision is made (a clock stepped back) is the engine's,
// not the key's.

// counterKey is the counter of window idx under state key key, in key's
// hash slot (fixed_window.lua builds the same name).
func counterKey(key string, idx int64) string {
	return key + ":w" + strconv.FormatInt(idx, 10)
}

// windowNow returns the time (ms) a counted decision sent now is made at
// as the engine expects it, the engine's floor below which none is made,
// and whether the time is the injected clock's (then it is exact, and no
// TIME is read).
func (e *Engine) windowNow() (now, floor int64, injected bool) {
	floor = e.clk.floor()
	if e.cfg.Clock != nil {
		return max(e.cfg.Clock.Now().UnixMilli(), floor), floor, true
	}
	return max(e.clk.estimate(), floor), floor, false
}

// windowSettled is what a counted decision's round trip leaves to do.
type windowSettled struct {
	missed bool // it ran outside its window: take the charge back and decide again, with the script
	refund bool // refused and not counted: take the charge back
	lost   bool // the birth marker was missing: record it
}

// settleWindow decides a counted fixed-window decision from its round
// trip: sent for window win, of w ms, with this capacity and cost; the
// server clock read before (t1) and after (t2) its charge, at least the
// engine's floor; the counter after the charge (n), of which pending are
// the charges of the call's earlier decisions on it that are to be taken
// back; the store's birth marker (hasBorn false: missing); and whether a
// charge that does not fit is counted all the same (postHoc).
//
// It is policy's fixedWindow, with the state a counter per window: a store
// born in the current window (policy.Fresh) counts it used up, on top of
// its counter, and the rest is the counter against the capacity.
func settleWindow(
	capacity, w, cost, win, t1, t2, n, pending, born int64,
	hasBorn, postHoc bool,
) (policy.Decision, windowSettled) {
	if t1/w != win || t2/w != win {
		return policy.Decision{}, windowSettled{missed: true, refund: true}
	}
	var s windowSettled
	now, used := t1, int64(0)
	if !hasBorn || born > 0 && max(now, born) < (born/w+1)*w {
		if !hasBorn {
			born, s.lost = now, true // the first to find it missing records now
		}
		now, used = max(now, born), capacity
	}
	end := (now/w + 1) * w
	before := used + n - cost - pending
	d := policy.Decision{Allowed: before+cost <= capacity, ResetAfterMs: end - now}
	after := before + cost
	if s.refund = !d.Allowed && !postHoc; s.refund {
		after = before
	}
	if !d.Allowed {
		d.RetryAfterMs = end - now
	}
	d.SetLeft(capacity - after)
	return d, s
}

// decideCounted decides ds, some of them counted fixed windows: on one
// node in one pipeline, plus one round trip when charges are to be taken
// back; on a cluster one such pipeline per master, concurrently, each with
// its decisions in order. A decision a master refuses because its slot
// moved (MOVED, ASK) did not run: the script decides it again through the
// cluster client, which follows the redirection.
func (e *Engine) decideCounted(ctx context.Context, ds []decision) []decided {
	out := make([]decided, len(ds))
	if e.cluster == nil {
		idx := make([]int, len(ds))
		for i := range idx {
			idx[i] = i
		}
		e.onNode(ctx, e.rdb, ds, idx, out)
		return out
	}
	type master struct {
		rdb        *redis.Client
		idx, moved []int
	}
	var masters []*master
	byAddr := map[string]*master{}
	for i := range ds {
		c, err := e.cluster.MasterForKey(ctx, ds[i].keys[0])
		if err != nil {
			out[i].err = err
			continue
		}
		m := byAddr[c.Options().Addr]
		if m == nil {
			m = &master{rdb: c}
			byAddr[c.Options().Addr] = m
			masters = append(masters, m)
		}
		m.idx = append(m.idx, i)
	}
	var wg sync.WaitGroup
	for _, m := range masters {
		wg.Go(func() { m.moved = e.onNode(ctx, m.rdb, ds, m.idx, out) })
	}
	wg.Wait()
	var moved []int
	for _, m := range masters {
		moved = append(moved, m.moved...)
	}
	if len(moved) > 0 {
		slices.Sort(moved)
		again := make([]decision, len(moved))
		for k, j := range moved {
			again[k] = ds[j]
		}
		for k, res := range e.decideScripts(ctx, again) {
			out[moved[k]] = res
		}
	}
	return out
}

// onNode decides the decisions idx of ds, in order, on one Redis node (the
// only one, or a cluster master) into out, and returns those the node
// refused with MOVED or ASK.
func (e *Engine) onNode(ctx context.Context, rdb Client, ds []decision, idx []int, out []decided) []int {
	c := nodeCall{e: e, rdb: rdb, ds: ds, out: out}
	c.first(ctx, idx)
	c.finish(ctx)
	return c.moved
}

// nodeCall is one call's decisions on one node, and what its next round
// trip has to do.
type nodeCall struct {
	e     *Engine
	rdb   Client
	ds    []decision
	out   []decided
	moved []int // refused with MOVED or ASK: not run

	refunds []refund         // charges to take back
	borns   map[string]int64 // birth markers found missing, to record
	again   []int            // decisions for the script
	eval    bool             // the node did not know the script: send its source
}

// refund takes back a charge of cost on counter key, which expires after
// ttl ms if the refund creates it (it expired meanwhile).
type refund struct {
	key       string
	cost, ttl int64
}

// charge is a counted decision in flight, the seq-th call of its pipeline.
type charge struct {
	j    int // in ds
	seq  int
	win  int64
	key  string
	incr *redis.IntCmd
	born *redis.StringCmd
}

// scriptGroup is one decision script call in flight, the seq-th call of
// its pipeline, at now (scriptNow).
type scriptGroup struct {
	idx []int
	seq int
	now string
	cmd *redis.Cmd
}

// first sends the decisions idx in one pipeline: each counted decision
// as its charge, the others to the script in calls of consecutive
// decisions, so that each decision sees what those before it charged. A
// script decision on a key this pipeline charges waits, with the key's
// decisions after it, for the next round trip: a rejected charge is taken
// back only then, and the script must not see it.
func (c *nodeCall) first(ctx context.Context, idx []int) {
	now, floor, injected := c.e.windowNow()
	q := c.queue(ctx, idx, now, floor, injected)
	sent := time.Now()
	_, _ = q.pipe.Exec(ctx) // errors are read per command
	recv := time.Now()
	c.readScripts(q.groups)
	if len(q.charges) == 0 {
		return
	}
	c.settle(q, now, floor, sent, recv)
}

// queued is one pipeline of first: the server clock read before and
// after it (none with an injected clock), its script calls and its
// charges.
type queued struct {
	pipe    redis.Pipeliner
	t1, t2  *redis.TimeCmd
	groups  []scriptGroup
	charges []charge
}

// queue queues the decisions idx of first, at now on the agent's estimate
// of the server clock.
func (c *nodeCall) queue(ctx context.Context, idx []int, now, floor int64, injected bool) queued {
	e := c.e
	nowArg, _ := e.scriptNow()
	margin := e.cfg.TTLMargin.Milliseconds()
	pipe := c.rdb.Pipeline()
	q := queued{pipe: pipe}
	if !injected {
		q.t1 = pipe.Time(ctx)
	}
	borns := map[string]*redis.StringCmd{}
	var charges []charge
	var groups []scriptGroup
	var run []int
	flush := func() { // the script decisions asked for before the next charge
		for _, g := range e.groupOf(c.ds, run) {
			sg := c.send(ctx, pipe, g, nowArg, floor)
			sg.seq = len(groups) + len(charges)
			groups = append(groups, sg)
		}
		run = nil
	}
	var charged, waiting map[string]bool // state keys charged here; whose decisions wait
	for _, j := range idx {
		if !c.ds[j].counted {
			charged = map[string]bool{} // scripts among them: keep track
			break
		}
	}
	for _, j := range idx {
		d := &c.ds[j]
		if waiting[d.keys[0]] {
			c.again = append(c.again, j)
			continue
		}
		if !d.counted {
			if charged[d.keys[0]] {
				if waiting == nil {
					waiting = map[string]bool{}
				}
				waiting[d.keys[0]] = true
				c.again = append(c.again, j)
				continue
			}
			run = append(run, j)
			continue
		}
		if charged != nil {
			charged[d.keys[0]] = true
		}
		flush()
		b, ok := borns[d.keys[1]]
		if !ok {
			b = pipe.Get(ctx, d.keys[1])
			borns[d.keys[1]] = b
		}
		win := now / d.windowMs
		key := counterKey(d.keys[0], win)
		incr := pipe.IncrBy(ctx, key, d.cost)
		charges = append(charges, charge{j: j, seq: len(groups) + len(charges), win: win, key: key, incr: incr, born: b})
		_ = pipe.Process(ctx, pexpireNX(ctx, key, (win+1)*d.windowMs-now+margin))
	}
	flush()
	if !injected {
		q.t2 = pipe.Time(ctx)
	}
	q.groups, q.charges = groups, charges
	return q
}

// settle reads the charges of pipeline q, sent at sent and answered at
// recv: each decided against the server clock read around it, or taken
// back and decided again.
func (c *nodeCall) settle(q queued, now, floor int64, sent, recv time.Time) {
	// A script call the node did not know did not run (NOSCRIPT): the
	// charges sent after it in its slot are taken back and decided again
	// with it, in order, so that none is decided before a decision asked
	// for earlier on its key.
	unknown := map[int]int{} // slot -> the first script call that did not run
	for _, g := range q.groups {
		if redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
			if _, ok := unknown[c.slot(g.idx[0])]; !ok {
				unknown[c.slot(g.idx[0])] = g.seq
			}
		}
	}
	e := c.e
	ta, tb := now, now
	if q.t1 != nil {
		if err := errors.Join(q.t1.Err(), q.t2.Err()); err != nil {
			for _, ch := range q.charges {
				if c.out[ch.j].err = err; ch.incr.Err() == nil { // charged, but not to be settled
					c.refund(ch, ch.win*c.ds[ch.j].windowMs)
				}
			}
			return
		}
		e.clk.observe(q.t1.Val(), sent, recv)
		ta, tb = max(q.t1.Val().UnixMilli(), floor), max(q.t2.Val().UnixMilli(), floor)
	}
	e.clk.raise(ta)
	pending := map[string]int64{}
	for _, ch := range q.charges {
		d := &c.ds[ch.j]
		n, err := ch.incr.Result()
		if err != nil {
			if isMoved(err) {
				c.moved = append(c.moved, ch.j)
			} else {
				c.out[ch.j].err = err
			}
			continue
		}
		if seq, ok := unknown[c.slot(ch.j)]; ok && ch.seq > seq {
			c.again = append(c.again, ch.j)
			pending[ch.key] += d.cost
			c.refund(ch, tb)
			continue
		}
		born, err := ch.born.Int64()
		hasBorn := err == nil
		if err != nil && !errors.Is(err, redis.Nil) {
			c.out[ch.j].err = err
			c.refund(ch, tb)
			continue
		}
		dec, s := settleWindow(d.capacity, d.windowMs, d.cost, ch.win, ta, tb, n, pending[ch.key], born, hasBorn, d.postHoc)
		if s.missed {
			c.again = append(c.again, ch.j)
		} else {
			c.out[ch.j].d = dec
		}
		if s.lost {
			if c.borns == nil {
				c.borns = map[string]int64{}
			}
			if _, ok := c.borns[d.keys[1]]; !ok {
				c.borns[d.keys[1]] = ta
			}
		}
		if s.refund {
			pending[ch.key] += d.cost
			c.refund(ch, tb)
		}
	}
}

// slot is the hash slot of decision j on a cluster; on one node, where
// any decisions may share a script call, 0 for all.
func (c *nodeCall) slot(j int) int {
	if c.e.cluster == nil {
		return 0
	}
	return KeySlot(c.ds[j].keys[0])
}

// refund queues the charge ch to be taken back, the server clock being at
// least now.
func (c *nodeCall) refund(ch charge, now int64) {
	d := &c.ds[ch.j]
	ttl := max(1, (ch.win+1)*d.windowMs+c.e.cfg.TTLMargin.Milliseconds()-now)
	c.refunds = append(c.refunds, refund{key: ch.key, cost: d.cost, ttl: ttl})
}

// finish sends what the first round trip left: refunds, birth markers to
// record, and the decisions for the script (again if the node did not know
// it), before the call returns, so that the caller's next decision sees no
// charge of a rejection.
func (c *nodeCall) finish(ctx context.Context) {
	for round := 0; round < 3 && (len(c.refunds) > 0 || len(c.borns) > 0 || len(c.again) > 0); round++ {
		pipe := c.rdb.Pipeline()
		for _, r := range c.refunds {
			pipe.DecrBy(ctx, r.key, r.cost)
			_ = pipe.Process(ctx, pexpireNX(ctx, r.key, r.ttl))
		}
		for k, v := range c.borns {
			pipe.SetNX(ctx, k, v, 0)
		}
		again := c.again
		c.refunds, c.borns, c.again = nil, nil, nil
		slices.Sort(again)
		var groups []scriptGroup
		now, floor := c.e.scriptNow()
		for _, g := range c.e.groupOf(c.ds, again) {
			groups = append(groups, c.send(ctx, pipe, g, now, floor))
		}
		_, _ = pipe.Exec(ctx) // a refund that fails leaves its charge: fewer admissions, never more
		c.readScripts(groups)
	}
	for _, j := range c.again {
		c.out[j].err = errors.New("the node did not load the decision script")
	}
}

// send adds the decisions g as one script call to pipe.
func (c *nodeCall) send(ctx context.Context, pipe redis.Pipeliner, g []int, now string, floor int64) scriptGroup {
	call := callOf(c.ds, g, now, floor, c.e.cfg.ReservationTTL.Milliseconds())
	if c.eval {
		return scriptGroup{idx: g, now: now, cmd: decideScript.Eval(ctx, pipe, call.keys, call.args...)}
	}
	return scriptGroup{idx: g, now: now, cmd: decideScript.EvalSha(ctx, pipe, call.keys, call.args...)}
}

// readScripts hands the script calls' decisions their outcomes; a call
// the node did not run (it did not know the script, or the slot moved) is
// queued again.
func (c *nodeCall) readScripts(groups []scriptGroup) {
	for _, g := range groups {
		switch err := g.cmd.Err(); {
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			c.eval = true
			c.again = append(c.again, g.idx...)
		case isMoved(err):
			c.moved = append(c.moved, g.idx...)
		default:
			c.e.read(g.cmd, c.ds, g.idx, c.out)
			c.e.raiseFloor(c.ds, g.idx, c.out, g.now)
		}
	}
}

// isMoved reports a cluster node's refusal of a command for a slot it does
// not serve (now, or yet): the command did not run.
func isMoved(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")
}

// pexpireNX sets key's TTL to ms unless it has one (PEXPIRE ... NX, Redis
// 7.0 and later).
func pexpireNX(ctx context.Context, key string, ms int64) *redis.BoolCmd {
	return redis.NewBoolCmd(ctx, "pexpire", key, ms, "nx")
}
