package regional

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/policy"
)

// Client is the part of a Redis client the engine needs. *redis.Client and
// *redis.ClusterClient satisfy it.
//
// A client that retries commands on network errors may run a decision
// twice; give requests an idempotency key, or configure MaxRetries: -1.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Config tunes an Engine. Start from DefaultConfig: as everywhere in
// quota-lease, a zero is a value, never a request for the default.
type Config struct {
	// Clock, when set, supplies enforcement time (its wall reading, in
	// milliseconds) instead of the Redis server clock. Only tests set it.
	Clock clock.Clock
	// IdempotencyWindow is how long a decision made for an idempotency key
	// is replayed. Default 10s.
	IdempotencyWindow time.Duration
	// ReservationTTL is how long a reservation (admission.Request.Reserve)
	// waits for its settlement; one never settled keeps its estimate.
	// Default 10m.
	ReservationTTL time.Duration
	// TTLMargin is added to every key's TTL beyond the time it needs to
	// return to its idle state. Default 1s.
	TTLMargin time.Duration
	// Pipelines, when above 0, is how many pipelines of concurrent
	// one-ticket Decide calls may be in flight at once: each takes every
	// call queued while the previous ones were in flight (pipeliner). 0
	// sends every call on its own. An engine with pipelines must be closed
	// (Close). Default 0.
	Pipelines int
}

// Defaults for Config.
const (
	DefaultIdempotencyWindow = 10 * time.Second
	DefaultReservationTTL    = 10 * time.Minute
	DefaultTTLMargin         = time.Second
)

// DefaultConfig returns a Config with every setting at its default.
func DefaultConfig() Config {
	return Config{
		IdempotencyWindow: DefaultIdempotencyWindow,
		ReservationTTL:    DefaultReservationTTL,
		TTLMargin:         DefaultTTLMargin,
	}
}

// ValidateConfig reports every setting of c that cannot work, joined.
func ValidateConfig(c Config) error {
	var errs []error
	if c.IdempotencyWindow <= 0 || c.ReservationTTL <= 0 || c.TTLMargin <= 0 {
		errs = append(errs, fmt.Errorf("idempotency window %s, reservation TTL %s and TTL margin %s must be "+
			"positive", c.IdempotencyWindow, c.ReservationTTL, c.TTLMargin))
	}
	if c.Pipelines < 0 {
		errs = append(errs, fmt.Errorf("pipelines %d is negative", c.Pipelines))
	}
	return errors.Join(errs...)
}

// Engine decides tickets for one region against its Redis: it is the
// admission pipeline's store (admission.Store). It is safe for concurrent
// use.
type Engine struct {
	rdb      Client
	pipe     *pipeliner           // nil without Config.Pipelines
	cluster  *redis.ClusterClient // rdb, when it is a Redis Cluster: one birth marker per slot
	cfg      Config
	policies admission.PolicySet // for Check and CheckBatch
	turn     atomic.Uint64       // counts checks of sharded policies, which shard spreads by it
	marginMs any                 // cfg.TTLMargin in ms, boxed once as a script argument
	clk      *redisClock         // the server clock as the fixed windows' counters need it
	// scriptedWindows sends every fixed-window decision to the script, as
	// those with an idempotency key are (tests compare both ways).
	scriptedWindows bool
}

// NewEngine returns an engine deciding with rdb. policies are those Check
// and CheckBatch look requests up in; an engine used only as an
// admission.Store needs none.
func NewEngine(rdb Client, policies []*policy.Policy, cfg Config) (*Engine, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, fmt.Errorf("regional engine config: %w", err)
	}
	e := &Engine{rdb: rdb, cfg: cfg, marginMs: cfg.TTLMargin.Milliseconds(), clk: newRedisClock()}
	e.cluster, _ = rdb.(*redis.ClusterClient)
	if err := e.SetPolicies(policies); err != nil {
		return nil, err
	}
	if cfg.Pipelines > 0 {
		e.pipe = newPipeliner(e.decide, cfg.Pipelines)
	}
	return e, nil
}

// Close stops the engine's pipeline senders once what is queued is sent.
// Checks after Close are sent on their own. It is safe to call twice.
func (e *Engine) Close() {
	if e.pipe != nil {
		e.pipe.close()
	}
}

// SetPolicies validates policies and replaces the set Check and
// CheckBatch look requests up in. On error the previous set stays in force.
func (e *Engine) SetPolicies(policies []*policy.Policy) error {
	return e.policies.Set(policies)
}

// Policy returns the policy called name of the engine's set.
func (e *Engine) Policy(name string) (*policy.Policy, bool) {
	return e.policies.Policy(name)
}

// Result pairs a decision of a batch with its error.
type Result = admission.Decided

// Decide decides tickets in one round trip: in one atomic script run (one
// per hash slot on a cluster, and per maxScriptDecisions), and fixed
// windows without an idempotency key as charges of their counters in the
// same pipeline (window.go; one more round trip when a charge is taken
// back); a lone ticket goes through the pipeliner when the engine has one.
// The tickets are decided in order, each as if alone, so two tickets of
// one call for the same key are decided one after the other. A ticket
// whose key cannot be built (an identity too long) gets its error and is
// not sent.
func (e *Engine) Decide(ctx context.Context, ts []*admission.Ticket) []Result {
	var out []Result
	var ds []decision
	var idx []int
	if len(ts) == 1 { // the usual call: one allocation
		l := new(loneDecision)
		out, ds, idx = l.out[:], l.d[:0], l.idx[:0]
	} else {
		out, ds, idx = make([]Result, len(ts)), make([]decision, 0, len(ts)), make([]int, 0, len(ts))
	}
	for i, t := range ts {
		d, err := e.prepare(t)
		if err != nil {
			out[i].Err = err
			continue
		}
		ds = append(ds, d)
		idx = append(idx, i)
	}
	if len(ds) == 0 {
		return out
	}
	if len(ds) == 1 && e.pipe != nil {
		res, sent, err := e.pipe.do(ctx, ds[0])
		if err != nil {
			res.err = err
		}
		if sent || err != nil {
			out[idx[0]] = result(ds[0], res)
			e.settleUnrecorded(ctx, ts, out)
			return out
		}
	}
	for j, res := range e.decide(ctx, ds) {
		out[idx[j]] = result(ds[j], res)
	}
	e.settleUnrecorded(ctx, ts, out)
	return out
}

// loneDecision holds what Decide needs for one ticket.
type loneDecision struct {
	out [1]Result
	d   [1]decision
	idx [1]int
}

// result is the Result of decision d.
func result(d decision, res decided) Result {
	if res.err != nil {
		return Result{Err: fmt.Errorf("check policy %q: %w", d.policy, res.err)}
	}
	return Result{Decision: res.d}
}

// prepare lays t out as its part of a decision script call: the key of the
// shard it goes to, and the script's arguments. It touches nothing.
func (e *Engine) prepare(t *admission.Ticket) (decision, error) {
	p := t.Policy
	l := p.ShardLimits(t.Limits)
	key, err := ShardKey(p, t.Identity, e.shard(p, t.IdempotencyKey))
	if err != nil {
		return decision{}, err
	}
	keys := []string{key, e.bornKey(key)}
	if l.Algorithm == policy.SlidingLog {
		keys = append(keys, key+":m")
	}
	if t.Estimate > 0 { // a settlement reads its reservation's record
		keys = append(keys, idempotencyKey(key, t.IdempotencyKey))
	}
	idemMs := int64(0)
	if t.IdempotencyKey != "" {
		keys = append(keys, ticketIdempotencyKey(key, t))
		// An admitted reservation's and a settlement's: ReservationTTL
		// (lua/reservation.lua).
		idemMs = e.cfg.IdempotencyWindow.Milliseconds()
	}
	param := l.Rate
	if l.Algorithm != policy.TokenBucket {
		param = l.WindowMs
	}
	return decision{
		policy:   p.Name,
		keys:     keys,
		args:     [6]any{decisionCode(t, l), idemMs, l.Capacity, param, t.Cost * policy.Micro, e.marginMs},
		alg:      l.Algorithm,
		ret:      t.Return,
		counted:  l.Algorithm == policy.FixedWindow && idemMs == 0 && !t.Return && !p.Returns && !e.scriptedWindows,
		capacity: l.Capacity, windowMs: l.WindowMs, cost: t.Cost * policy.Micro, postHoc: l.PostHoc,
	}, nil
}

// shard picks the shard of p a request goes to: in turn, so that one
// identity's checks spread evenly over its shards; or, for a request with
// an idempotency key, the one the key hashes to, so that a retry finds the
// decision made for it.
func (e *Engine) shard(p *policy.Policy, idempotencyKey string) int64 {
	n := uint64(p.ShardCount())
	if n == 1 {
		return 0
	}
	if idempotencyKey != "" {
		h := fnv.New64a()
		h.Write([]byte(idempotencyKey))
		return int64(h.Sum64() % n)
	}
	return int64(e.turn.Add(1) % n)
}

// InitStore marks the engine's store as new if it carries no birth marker
// (BornKey) yet, and reports whether it did. Call it once when a region's
// agent starts, before its first check. Keys of a store marked new start at
// the zero State (full); a store that later loses its memory loses the
// marker with it, and the first script to find it missing records that
// moment, so keys lost with it start conservatively (policy.Fresh) instead of
// with a fresh burst.
//
// A store that lost its memory while no agent of the region was running is
// taken as new: what its agents admitted before is older than their own
// downtime, which is harmless once that exceeds the policies' IdleMs.
func (e *Engine) InitStore(ctx context.Context) (bool, error) {
	pipe := e.rdb.Pipeline()
	var cmds []*redis.BoolCmd
	if e.cluster == nil {
		cmds = append(cmds, pipe.SetNX(ctx, BornKey, 0, 0))
	} else {
		for slot := 0; slot < ClusterSlots; slot++ {
			cmds = append(cmds, pipe.SetNX(ctx, SlotBornKey(slot), 0, 0))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("mark store as new: %w", err)
	}
	isNew := false
	for _, c := range cmds {
		isNew = isNew || c.Val()
	}
	return isNew, nil
}

// nowArg is the scripts' ARGV[1]: the injected clock's milliseconds, or
// "" to read Redis TIME.
func (e *Engine) nowArg() string {
	if e.cfg.Clock == nil {
		return ""
	}
	return strconv.FormatInt(e.cfg.Clock.Now().UnixMilli(), 10)
}

// bornKey is the birth marker a decision on key reads: the store's, or on
// a cluster its slot's.
func (e *Engine) bornKey(key string) string {
	if e.cluster == nil {
		return BornKey
	}
	return SlotBornKey(KeySlot(key))
}

// LoadScripts loads the decision script into Redis (SCRIPT LOAD) and so
// also opens a connection: an agent calls it at start, so that its first
// checks run EVALSHA on a warm connection instead of paying a dial and a
// NOSCRIPT round trip within their check timeout.
func (e *Engine) LoadScripts(ctx context.Context) error {
	if err := decideScript.Load(ctx, e.rdb).Err(); err != nil {
		return fmt.Errorf("load the decision script: %w", err)
	}
	return nil
}

// StoreBorn returns the store's birth marker: 0 for a store marked new, else
// the enforcement time (ms) at which the store was found to have lost its
// memory. A missing marker is recorded as lost now, as the first decision
// script to find it would: that is how a loss is noticed before any check
// touches the store. On a cluster it reads one slot per node (a node that
// restarts empty loses all its slots at once) and returns the latest.
func (e *Engine) StoreBorn(ctx context.Context) (int64, error) {
	keys := []string{BornKey}
	if e.cluster != nil {
		ranges, err := e.cluster.ClusterSlots(ctx).Result()
		if err != nil {
			return 0, fmt.Errorf("read cluster slots: %w", err)
		}
		keys = keys[:0]
		for _, r := range ranges {
			keys = append(keys, SlotBornKey(int(r.Start)))
		}
	}
	now := e.nowArg()
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		calls[i] = scriptCall{keys: []string{k}, args: []any{now}}
	}
	var ms int64
	for _, cmd := range runPipelined(ctx, e.rdb, bornScript, calls) {
		v, err := cmd.Int64()
		if err != nil {
			return 0, fmt.Errorf("read store birth marker: %w", err)
		}
		ms = max(ms, v)
	}
	return ms, nil
}
