// Package edgescript is a scripted run of one agent's edge rounds, for
// comparing the two drivers of edge.Round: the agent's (internal/agent,
// on its RLQS streams) and the simulator's (sim, on its Envoy
// instances). A script is what Envoy instances and the world do: usage
// reports, streams that end, the region's store going down and coming
// back, the region's capacity moving. Each driver's test feeds the same
// script to its own receive path and store glue, with the same leases
// (Leases), and writes every action its rounds send (Record); both must
// equal the one recorded in testdata/rounds.record. A driver that skips a
// step of the round, or feeds it differently, sends something else.
package edgescript

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/edge/tokens"
	"github.com/quota-lease/quota-lease/policy"
)

// PolicyYAML is the one policy the script's instances report buckets of;
// a bucket is {policy: api, tenant: <tenant>}.
const PolicyYAML = `name: api
identity: [tenant]
limit: 100
period: 1s
burst: 100
edge: {instances: 4, no_assignment: deny, ttl: 2s}
`

// Base is the script's time zero on the agent's and the store's clocks
// (Unix ms).
const Base = 1_000_000_000_000

// Drift is the lease's drift bound the rounds run with.
const Drift = 1e-4

// Tuning is the rounds' tuning: the defaults, with buckets abandoned
// after 10 s without requests so that the script sees it.
func Tuning() edge.Tuning {
	t := edge.DefaultTuning()
	t.AbandonAfter = 10 * time.Second
	return t
}

// Policy is PolicyYAML, parsed.
func Policy() *policy.Policy {
	ps, err := policy.ParsePolicies([]byte(PolicyYAML))
	if err != nil || len(ps) != 1 {
		panic(fmt.Sprintf("edgescript: the policy does not parse: %v", err))
	}
	return ps[0]
}

// Event is one line of the script.
type Event struct {
	At   time.Duration // since the start
	Kind string        // report, close, down, up or capacity
	// Instance reports, or its stream ends (close).
	Instance int
	// Tenant names the bucket reported, or whose capacity moves.
	Tenant string
	// A report's counts and time_elapsed.
	Allowed, Denied uint64
	Elapsed         time.Duration
	// Fraction is the tenant's capacity as a fraction of the limit.
	Fraction float64
}

//go:embed testdata/rounds.script
var script string

// End is when the script ends.
const End = 60 * time.Second

// Events is the script, in order.
func Events() []Event {
	var out []Event
	for n, line := range strings.Split(script, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		ev, err := parse(f)
		if err != nil {
			panic(fmt.Sprintf("edgescript: line %d: %v", n+1, err))
		}
		out = append(out, ev)
	}
	return out
}

func parse(f []string) (Event, error) {
	ms, err := strconv.Atoi(f[0])
	if err != nil || len(f) < 2 {
		return Event{}, fmt.Errorf("want a time (ms) and an event: %q", f)
	}
	ev := Event{At: time.Duration(ms) * time.Millisecond, Kind: f[1]}
	n := func(i int) int {
		if i >= len(f) {
			err = fmt.Errorf("%s: too few fields", ev.Kind)
			return 0
		}
		v, e := strconv.Atoi(f[i])
		if e != nil {
			err = e
		}
		return v
	}
	switch ev.Kind {
	case "report": // report <instance> <tenant> <allowed> <denied> <elapsed s>
		ev.Instance, ev.Tenant = n(2), f[min(3, len(f)-1)]
		ev.Allowed, ev.Denied, ev.Elapsed = uint64(n(4)), uint64(n(5)), time.Duration(n(6))*time.Second
	case "close": // close <instance>
		ev.Instance = n(2)
	case "capacity": // capacity <tenant> <percent of the limit>
		ev.Tenant, ev.Fraction = f[min(2, len(f)-1)], float64(n(3))/100
	case "down", "up":
	default:
		return Event{}, fmt.Errorf("unknown event %q", ev.Kind)
	}
	return ev, err
}

// Leases are the leases both drivers plan with: a grant valid past the
// script's end, the limit as every tenant's capacity until a capacity
// event moves it. Safe for concurrent use.
type Leases struct {
	P  *policy.Policy
	mu sync.Mutex
	c  map[string]int64 // by identity
}

// NewLeases returns the script's leases of p.
func NewLeases(p *policy.Policy) *Leases { return &Leases{P: p, c: map[string]int64{}} }

// Apply moves a tenant's capacity (a capacity event).
func (l *Leases) Apply(ev Event) {
	id, _ := l.P.IdentityOf(map[string]string{"tenant": ev.Tenant})
	l.mu.Lock()
	l.c[id] = int64(ev.Fraction * float64(l.P.Limits().Amount()))
	l.mu.Unlock()
}

func (l *Leases) Policy(name string) *policy.Policy {
	if name != l.P.Name {
		return nil
	}
	return l.P
}

func (l *Leases) ValidUntil(string) time.Time { return time.UnixMilli(Base).Add(time.Hour) }

func (l *Leases) EnforceAt(_, identity string, _ time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.c[identity]; ok {
		return c
	}
	return l.P.Limits().Amount()
}

func (l *Leases) Heir() string { return "" }

// Record is the actions a driver's rounds sent, one line each: when (ms
// since the start), to which instance, for which tenant, and what.
type Record struct{ lines []line }

type line struct {
	ms       int64
	instance int
	text     string
}

// Add records an action sent at at to instance for tenant: an assignment
// of b for ttl, or an abandon.
func (r *Record) Add(at time.Duration, instance int, tenant string, abandon bool, b tokens.Bucket, ttl time.Duration) {
	text := fmt.Sprintf("assign %d/%d per %s ttl %s", b.MaxTokens, b.TokensPerFill, b.FillInterval, ttl)
	switch {
	case abandon:
		text = "abandon"
	case b.Deny():
		text = "deny ttl " + ttl.String()
	}
	r.lines = append(r.lines, line{at.Milliseconds(), instance, fmt.Sprintf("%s %s", tenant, text)})
}

// String is the record, by time and instance; an instance's actions of
// one round in the order sent.
func (r *Record) String() string {
	ls := slices.Clone(r.lines)
	slices.SortStableFunc(ls, func(a, b line) int {
		if a.ms != b.ms {
			return int(a.ms - b.ms)
		}
		return a.instance - b.instance
	})
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%d %d %s\n", l.ms, l.instance, l.text)
	}
	return b.String()
}

//go:embed testdata/rounds.record
var recorded string

// Check returns an error naming the first line where got differs from
// the recorded actions. With QL_UPDATE_EDGE_RECORD=1 in the environment
// it writes got as the record instead.
func Check(got *Record) error {
	text := got.String()
	if os.Getenv("QL_UPDATE_EDGE_RECORD") == "1" {
		_, file, _, _ := runtime.Caller(0)
		return os.WriteFile(filepath.Join(filepath.Dir(file), "testdata", "rounds.record"), []byte(text), 0o644)
	}
	if text == recorded {
		return nil
	}
	g, w := strings.Split(text, "\n"), strings.Split(recorded, "\n")
	for i := range max(len(g), len(w)) {
		at := func(s []string) string {
			if i < len(s) {
				return s[i]
			}
			return "(nothing)"
		}
		if at(g) != at(w) {
			return fmt.Errorf("line %d of %d: sent %q, recorded %q", i+1, len(w), at(g), at(w))
		}
	}
	return nil
}
