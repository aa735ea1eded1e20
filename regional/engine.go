package regional

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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

// Config tunes an Engine. The zero value is ready for production.
type Config struct {
	// Clock, when set, supplies enforcement time (its wall reading, in
	// milliseconds) instead of the Redis server clock. Only tests set it.
	Clock clock.Clock
	// IdempotencyWindow is how long a decision made for an idempotency key
	// is replayed. Default 10s.
	IdempotencyWindow time.Duration
	// TTLMargin is added to every key's TTL beyond the time it needs to
	// return to its idle state. Default 1s.
	TTLMargin time.Duration
	// Pipelines, when above 0, is how many pipelines of concurrent Check
	// calls may be in flight at once: each takes every call queued while
	// the previous ones were in flight (pipeliner). 0 sends every Check on
	// its own. An engine with pipelines must be closed (Close).
	Pipelines int
}

// Defaults for Config.
const (
	DefaultIdempotencyWindow = 10 * time.Second
	DefaultTTLMargin         = time.Second
)

// Errors returned for requests the engine refuses before touching Redis.
var (
	// ErrUnknownPolicy reports a request naming no loaded policy.
	ErrUnknownPolicy = errors.New("unknown policy")
	// ErrInvalidRequest reports a malformed request.
	ErrInvalidRequest = errors.New("invalid request")
)

// Engine decides checks for one region against its Redis. It is safe for
// concurrent use; its policies can be replaced while it serves.
type Engine struct {
	rdb      Client
	pipe     *pipeliner           // nil without Config.Pipelines
	cluster  *redis.ClusterClient // rdb, when it is a Redis Cluster: one birth marker per slot
	cfg      Config
	policies atomic.Pointer[map[string]*policy.Policy]
	turn     atomic.Uint64 // counts checks of sharded policies, which shard spreads by it
	marginMs any           // cfg.TTLMargin in ms, boxed once as a script argument
}

// NewEngine returns an engine deciding with rdb under the given policies.
func NewEngine(rdb Client, policies []*policy.Policy, cfg Config) (*Engine, error) {
	if cfg.IdempotencyWindow <= 0 {
		cfg.IdempotencyWindow = DefaultIdempotencyWindow
	}
	if cfg.TTLMargin <= 0 {
		cfg.TTLMargin = DefaultTTLMargin
	}
	e := &Engine{rdb: rdb, cfg: cfg, marginMs: cfg.TTLMargin.Milliseconds()}
	e.cluster, _ = rdb.(*redis.ClusterClient)
	if cfg.Pipelines < 0 {
		return nil, fmt.Errorf("%w: pipelines %d is negative", ErrInvalidRequest, cfg.Pipelines)
	}
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

// SetPolicies validates policies and replaces the loaded set atomically.
// On error the previous set stays in force.
func (e *Engine) SetPolicies(policies []*policy.Policy) error {
	m := make(map[string]*policy.Policy, len(policies))
	for _, p := range policies {
		if err := p.Validate(); err != nil {
			return err
		}
		if _, dup := m[p.Name]; dup {
			return fmt.Errorf("%w: policy %q is defined twice", policy.ErrInvalidPolicy, p.Name)
		}
		m[p.Name] = p
	}
	e.policies.Store(&m)
	return nil
}

// Policy returns the loaded policy called name.
func (e *Engine) Policy(name string) (*policy.Policy, bool) {
	p, ok := (*e.policies.Load())[name]
	return p, ok
}

// Request is one check: may this much be admitted for this identity now?
type Request struct {
	// Policy names the policy to enforce.
	Policy string
	// Attributes are the request's attributes; the policy's identity picks
	// the ones it counts by.
	Attributes map[string]string
	// Cost in whole units, at least 1. Callers that let a client omit it
	// use the policy's Cost.
	Cost int64
	// IdempotencyKey, when set, makes a retried request get the decision
	// already made for it within the idempotency window, uncharged.
	IdempotencyKey string
	// Identity, when set, is the request's identity under the policy as
	// policy.Policy.IdentityOf returned it for Attributes: a caller that
	// already computed it spares the engine doing it again.
	Identity string
	// Limits, when set, are enforced instead of the policy's full limit:
	// the regional agent passes the share its lease grants. The algorithm
	// must be the policy's.
	Limits *policy.Limits
}

// Result pairs a decision of a batch with its error.
type Result struct {
	Decision policy.Decision
	Err      error
}

// prepare validates r and resolves it to its part of a decision script
// call. It touches nothing, so a refused request changes no state.
func (e *Engine) prepare(r Request) (decision, error) {
	p, ok := e.Policy(r.Policy)
	if !ok {
		return decision{}, fmt.Errorf("%w %q", ErrUnknownPolicy, r.Policy)
	}
	l := p.Limits()
	if r.Limits != nil {
		l = *r.Limits
		if l.Algorithm != p.Algorithm {
			return decision{}, fmt.Errorf("%w: policy %q: limits for %s, policy uses %s", ErrInvalidRequest, p.Name, l.Algorithm, p.Algorithm)
		}
		if err := l.Validate(); err != nil {
			return decision{}, fmt.Errorf("policy %q: %w", p.Name, err)
		}
	}
	if n := p.ShardCount(); n > 1 {
		l = p.ShardLimits(l)
		if err := l.Validate(); err != nil {
			return decision{}, fmt.Errorf("policy %q: split into %d shards: %w", p.Name, n, err)
		}
	}
	if r.Cost < 1 {
		return decision{}, fmt.Errorf("policy %q: %w, got %d", p.Name, policy.ErrInvalidCost, r.Cost)
	}
	if r.Cost > l.Capacity/policy.Micro {
		return decision{}, fmt.Errorf("policy %q: %w (cost %d, capacity %s%s)", p.Name, policy.ErrCostExceedsCapacity, r.Cost, formatUnits(l.Capacity), shardNote(p))
	}
	id := r.Identity
	if id == "" {
		var err error
		if id, err = p.IdentityOf(r.Attributes); err != nil {
			return decision{}, fmt.Errorf("policy %q: %w", p.Name, err)
		}
	}
	key, err := ShardKey(p, id, e.shard(p, r.IdempotencyKey))
	if err != nil {
		return decision{}, err
	}
	keys := []string{key, e.bornKey(key)}
	if l.Algorithm == policy.SlidingLog {
		keys = append(keys, key+":m")
	}
	idemMs := int64(0)
	if r.IdempotencyKey != "" {
		ik, err := idempotencyKey(key, r.IdempotencyKey)
		if err != nil {
			return decision{}, fmt.Errorf("policy %q: %w", p.Name, err)
		}
		keys = append(keys, ik)
		idemMs = e.cfg.IdempotencyWindow.Milliseconds()
	}
	param := l.Rate
	if l.Algorithm != policy.TokenBucket {
		param = l.WindowMs
	}
	return decision{
		policy: p.Name,
		keys:   keys,
		args:   [6]any{algorithmCodes[l.Algorithm], idemMs, l.Capacity, param, r.Cost * policy.Micro, e.marginMs},
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

// shardNote says, in an error, that a capacity is one shard's.
func shardNote(p *policy.Policy) string {
	if n := p.ShardCount(); n > 1 {
		return fmt.Sprintf(", one of %d shards", n)
	}
	return ""
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

// Check decides one request in one atomic script run: with
// Config.Pipelines, together with the other checks queued meanwhile.
func (e *Engine) Check(ctx context.Context, r Request) (policy.Decision, error) {
	d, err := e.prepare(r)
	if err != nil {
		return policy.Decision{}, err
	}
	var res decided
	sent := false
	if e.pipe != nil {
		if res, sent, err = e.pipe.do(ctx, d); err != nil {
			return policy.Decision{}, fmt.Errorf("check policy %q: %w", d.policy, err)
		}
	}
	if !sent {
		res = e.decide(ctx, []decision{d})[0]
	}
	if res.err != nil {
		return policy.Decision{}, fmt.Errorf("check policy %q: %w", d.policy, res.err)
	}
	return res.d, nil
}

// CheckBatch decides many requests in one round trip, in one atomic script
// run (one per hash slot on a cluster, and per maxScriptDecisions). The
// requests are decided in order, each as if alone, so two requests of one
// batch for the same key are decided one after the other. Requests that
// fail validation get their error and are not sent.
func (e *Engine) CheckBatch(ctx context.Context, rs []Request) []Result {
	out := make([]Result, len(rs))
	var ds []decision
	var idx []int
	for i, r := range rs {
		d, err := e.prepare(r)
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
	for j, res := range e.decide(ctx, ds) {
		if res.err != nil {
			res.err = fmt.Errorf("check policy %q: %w", ds[j].policy, res.err)
		}
		out[idx[j]] = Result{Decision: res.d, Err: res.err}
	}
	return out
}

// formatUnits prints micro-units as units, without trailing zeros.
func formatUnits(micro int64) string {
	s := strconv.FormatFloat(policy.Units(micro), 'f', 6, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
