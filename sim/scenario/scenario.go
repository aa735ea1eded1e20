// Package scenario is the simulator's scenario file: the regions, the one
// policy, the traffic (generated, in tenant groups that move, or a trace),
// the faults and the edge a run replays, read from YAML with every default
// filled in and every field checked (Load, Parse). Package sim runs it.
package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/policy"
)

// Scenario is one simulation, as a YAML file describes it.
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	Seed        uint64 `yaml:"seed"`
	// Duration of virtual time to simulate.
	Duration policy.Duration `yaml:"duration"`
	Regions  []string        `yaml:"regions"`
	// Policy is one policy, as in a policy file.
	Policy yaml.Node `yaml:"policy"`
	Lease  struct {
		Duration        policy.Duration `yaml:"duration"`
		Drift           float64         `yaml:"drift"`
		Margin          policy.Duration `yaml:"margin"`
		DegradedTimeout policy.Duration `yaml:"degraded_timeout"`
	} `yaml:"lease"`
	Rebalance struct {
		Interval   policy.Duration     `yaml:"interval"`
		Strategy   allocation.Strategy `yaml:"strategy"`
		MaxStep    float64             `yaml:"max_step"`
		Hysteresis float64             `yaml:"hysteresis"`
	} `yaml:"rebalance"`
	Network struct {
		Delay  policy.Duration `yaml:"delay"`
		Jitter policy.Duration `yaml:"jitter"`
		Loss   float64         `yaml:"loss"`
	} `yaml:"network"`
	// Tenants send the generated traffic; tenant-0 sends HotTenant of it.
	Tenants   int       `yaml:"tenants"`
	HotTenant float64   `yaml:"hot_tenant"`
	Traffic   []Traffic `yaml:"traffic"`
	Events    []Event   `yaml:"events"`
	// Groups, when set, generate the traffic instead of Traffic and
	// Tenants: tenants with a home, each group's tenants sending at their
	// own rate from the regions its weights name, and moving when its
	// moves say.
	Groups []Group `yaml:"groups"`
	// Trace, when set, is a file of explicit arrivals (relative to the
	// scenario file) that replaces the generated traffic.
	Trace string `yaml:"trace"`
	// Window is the length of the windows admissions are measured over;
	// default the policy's period.
	Window policy.Duration `yaml:"window"`
	// Edge, when set, puts Envoy instances behind every region, served by
	// the region's agent as an RLQS server (package sim, edge.go); groups send
	// through them the part of their requests their Edge field says.
	Edge *EdgeSpec `yaml:"edge"`
	// Conversations, when set, makes every arrival a request whose cost
	// is known only when it ends, under a policy that takes charges after
	// the fact: a check, then a charge (conversations.go).
	Conversations *Conversations `yaml:"conversations"`

	policy *policy.Policy
	dir    string
}

// Parsed is the scenario's policy, parsed and validated.
func (s *Scenario) Parsed() *policy.Policy { return s.policy }

// Dir is the directory of the scenario file (Load), which a trace's path
// is relative to; "" for a scenario from Parse.
func (s *Scenario) Dir() string { return s.dir }

// Traffic is one region's request rate over time.
type Traffic struct {
	Region string `yaml:"region"`
	// Shape: constant, ramp or follow-the-sun.
	Shape string `yaml:"shape"`
	// Rate in requests per second: the constant rate, a ramp's start, or
	// the follow-the-sun peak.
	Rate float64 `yaml:"rate"`
	// To is a ramp's end rate; Base the follow-the-sun night-time rate.
	To   float64 `yaml:"to"`
	Base float64 `yaml:"base"`
	// At and Until bound a ramp; PeakAt is the time of day of the peak.
	At     policy.Duration `yaml:"at"`
	Until  policy.Duration `yaml:"until"`
	PeakAt policy.Duration `yaml:"peak_at"`
}

// Group is a set of tenants that send alike: Tenants of them (named
// <name>-0, <name>-1, ...), each at Rate requests per second, arriving in
// the regions of Regions in proportion to their weights. Moves change the
// weights from a time on: the group's tenants move home.
type Group struct {
	Name    string             `yaml:"name"`
	Tenants int                `yaml:"tenants"`
	Rate    float64            `yaml:"rate"`
	Regions map[string]float64 `yaml:"regions"`
	Moves   []Move             `yaml:"moves"`
	// Edge is the part of the group's requests (0 to 1) that arrive
	// through the region's Envoy instances (the scenario's edge); the rest
	// are direct checks of the region's agent.
	Edge float64 `yaml:"edge"`
	// Instances are weights over a region's Envoy instances (the first
	// len(Instances) of them; default all alike): where the group's edge
	// requests arrive in every region.
	Instances []float64 `yaml:"instances"`
}

// Move is a group's new regional weights, or Envoy instance weights, or
// both, from At on; what it leaves out stays as it was.
type Move struct {
	At        policy.Duration    `yaml:"at"`
	Regions   map[string]float64 `yaml:"regions"`
	Instances []float64          `yaml:"instances"`
}

// Weights returns g's regional weights at t.
func (g *Group) Weights(t time.Duration) map[string]float64 {
	w := g.Regions
	for _, m := range g.Moves {
		if t >= time.Duration(m.At) && m.Regions != nil {
			w = m.Regions
		}
	}
	return w
}

// InstanceWeights returns g's Envoy instance weights at t (nil: all alike).
func (g *Group) InstanceWeights(t time.Duration) []float64 {
	w := g.Instances
	for _, m := range g.Moves {
		if t >= time.Duration(m.At) && m.Instances != nil {
			w = m.Instances
		}
	}
	return w
}

// Event is something that happens to the deployment.
type Event struct {
	// Kind: partition (region cut off from the coordinator),
	// coordinator-crash, redis-outage, redis-restart (an outage after
	// which the region's Redis is back empty), redis-flap (Redis slow past
	// the check timeout for Down at the start of every Period), clock-drift,
	// config-change, failover (region's traffic moves to To); with an edge,
	// agent-outage (the region's agent is down for For and comes back with
	// no edge state) and edge-partition (the region's Envoy instances
	// cannot reach its agent for For).
	Kind   string          `yaml:"kind"`
	Region string          `yaml:"region"`
	At     policy.Duration `yaml:"at"`
	For    policy.Duration `yaml:"for"`
	// Rate is a clock-drift's rate error (e.g. 1e-4, negative for slow).
	Rate float64 `yaml:"rate"`
	// Period and Down shape a redis-flap.
	Period policy.Duration `yaml:"period"`
	Down   policy.Duration `yaml:"down"`
	// To is a failover's destination region.
	To string `yaml:"to"`
	// Limit, Burst and Version are a config change's new values (0: keep).
	Limit   float64 `yaml:"limit"`
	Burst   float64 `yaml:"burst"`
	Version int64   `yaml:"version"`
}

// Load reads and validates a scenario file.
func Load(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s.dir = filepath.Dir(path)
	return s, nil
}

// ErrInvalidScenario is wrapped by every scenario validation error.
var ErrInvalidScenario = errors.New("invalid scenario")

// Parse reads a scenario from YAML, fills in defaults and validates it.
func Parse(data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidScenario, err)
	}
	if s.Policy.Kind == 0 {
		return nil, fmt.Errorf("%w: field %q is required", ErrInvalidScenario, "policy")
	}
	pol, err := yaml.Marshal(&s.Policy)
	if err != nil {
		return nil, fmt.Errorf("%w: policy: %v", ErrInvalidScenario, err)
	}
	ps, err := policy.ParsePolicies(pol)
	if err != nil {
		return nil, fmt.Errorf("%w: policy: %v", ErrInvalidScenario, err)
	}
	if len(ps) != 1 {
		return nil, fmt.Errorf("%w: exactly one policy per scenario", ErrInvalidScenario)
	}
	s.policy = ps[0]
	s.defaults()
	return &s, s.validate()
}

func (s *Scenario) defaults() {
	def := func(d *policy.Duration, v time.Duration) {
		if *d == 0 {
			*d = policy.Duration(v)
		}
	}
	def(&s.Lease.Duration, 10*time.Second)
	def(&s.Lease.Margin, 100*time.Millisecond)
	def(&s.Lease.DegradedTimeout, 10*time.Minute)
	def(&s.Rebalance.Interval, time.Second)
	def(&s.Network.Delay, 40*time.Millisecond)
	def(&s.Window, time.Duration(s.policy.Period))
	if s.Lease.Drift == 0 {
		s.Lease.Drift = 1e-4
	}
	if s.Rebalance.Strategy == "" {
		s.Rebalance.Strategy = allocation.StrategyMaxMinFair
	}
	if s.Rebalance.MaxStep == 0 {
		s.Rebalance.MaxStep = 0.1
	}
	if s.Rebalance.Hysteresis == 0 {
		s.Rebalance.Hysteresis = 0.01
	}
	if s.Tenants == 0 {
		s.Tenants = 1
	}
	if s.Edge != nil {
		def(&s.Edge.Delay, time.Millisecond)
		def(&s.Edge.ReportInterval, EnvoyReportInterval)
		if s.Edge.Instances == 0 && s.policy.Edge != nil {
			s.Edge.Instances = s.policy.Edge.Instances
		}
	}
	s.defaultConversations()
	for i := range s.Traffic {
		if s.Traffic[i].Shape == "" {
			s.Traffic[i].Shape = "constant"
		}
	}
}

func (s *Scenario) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidScenario, fmt.Sprintf(format, args...))
	}
	if s.Name == "" {
		return bad("name is required")
	}
	if s.Duration <= 0 || time.Duration(s.Duration) > 31*24*time.Hour {
		return bad("duration must be positive and at most 31 days, got %s", s.Duration)
	}
	if len(s.Regions) == 0 || len(s.Regions) > 16 {
		return bad("regions: 1 to 16 regions, got %d", len(s.Regions))
	}
	known := map[string]bool{}
	for _, r := range s.Regions {
		if !policy.RegionNameRE.MatchString(r) || known[r] {
			return bad("region %q is not a region name, or is listed twice", r)
		}
		known[r] = true
	}
	if s.policy.Scope != policy.ScopeGlobal {
		return bad("the policy must be global: a region-scoped one has nothing to simulate")
	}
	if s.Tenants < 1 || s.Tenants > 1_000_000 || math.IsNaN(s.HotTenant) || s.HotTenant < 0 || s.HotTenant >= 1 {
		return bad("tenants must be 1 to 1,000,000 and hot_tenant in [0, 1)")
	}
	if s.Network.Loss < 0 || s.Network.Loss >= 1 || math.IsNaN(s.Network.Loss) ||
		s.Network.Delay < 0 || s.Network.Jitter < 0 {
		return bad("network: delay and jitter must not be negative, loss must be in [0, 1)")
	}
	if s.Lease.Drift < 0 || s.Lease.Drift >= 0.01 || s.Window <= 0 {
		return bad("lease.drift must be in [0, 0.01) and window positive")
	}
	for i, t := range s.Traffic {
		if !known[t.Region] {
			return bad("traffic %d: unknown region %q", i, t.Region)
		}
		switch t.Shape {
		case "constant", "ramp", "follow-the-sun":
		default:
			return bad("traffic %d: shape %q; use constant, ramp or follow-the-sun", i, t.Shape)
		}
		for _, v := range []float64{t.Rate, t.To, t.Base} {
			if math.IsNaN(v) || v < 0 || v > 1e6 {
				return bad("traffic %d: rates must be in [0, 1e6] requests/s", i)
			}
		}
	}
	for i, e := range s.Events {
		switch e.Kind {
		case "partition", "redis-outage", "redis-restart":
			if !known[e.Region] || e.For <= 0 {
				return bad("event %d (%s): needs a known region and a positive 'for'", i, e.Kind)
			}
		case "redis-flap":
			if !known[e.Region] || e.For <= 0 || e.Down <= 0 ||
				e.Period <= e.Down || time.Duration(e.Period) < time.Millisecond {
				return bad("event %d (redis-flap): needs a known region, a positive 'for', and 0 < down < period "+
					"(period at least 1ms)", i)
			}
		case "coordinator-crash":
			if e.For <= 0 {
				return bad("event %d (coordinator-crash): needs a positive 'for'", i)
			}
		case "clock-drift":
			if !known[e.Region] || math.IsNaN(e.Rate) || math.Abs(e.Rate) > s.Lease.Drift {
				return bad("event %d (clock-drift): needs a known region and |rate| <= lease.drift (%v); a faster "+
					"clock breaks the safety argument", i, s.Lease.Drift)
			}
		case "config-change":
			if e.Limit < 0 || e.Burst < 0 || math.IsNaN(e.Limit) || math.IsNaN(e.Burst) {
				return bad("event %d (config-change): limit and burst must not be negative", i)
			}
		case "failover":
			if !known[e.Region] || !known[e.To] || e.Region == e.To {
				return bad("event %d (failover): needs two different known regions (region, to)", i)
			}
		case "agent-outage", "edge-partition":
			if s.Edge == nil || !known[e.Region] || e.For <= 0 {
				return bad("event %d (%s): needs an edge, a known region and a positive 'for'", i, e.Kind)
			}
		default:
			return bad("event %d: unknown kind %q", i, e.Kind)
		}
	}
	if err := s.validateGroups(known); err != nil {
		return bad("%v", err)
	}
	if err := s.validateEdge(); err != nil {
		return bad("%v", err)
	}
	if err := s.validateConversations(); err != nil {
		return bad("%v", err)
	}
	if len(s.Traffic) == 0 && s.Trace == "" && len(s.Groups) == 0 {
		return bad("no traffic, no groups and no trace: nothing to simulate")
	}
	return nil
}

// validateGroups checks the tenant groups: named once each, sending from
// known regions, moving forward in time, and alone (not mixed with
// traffic, tenants or a trace, which they replace).
func (s *Scenario) validateGroups(known map[string]bool) error {
	if len(s.Groups) == 0 {
		return nil
	}
	if len(s.Traffic) > 0 || s.Trace != "" || s.Tenants > 1 || s.HotTenant > 0 {
		return errors.New("groups replace traffic, tenants, hot_tenant and trace: use one or the other")
	}
	weights := func(what string, w map[string]float64) error {
		var sum float64
		for r, v := range w {
			if !known[r] || math.IsNaN(v) || v < 0 || v > 1e6 {
				return fmt.Errorf("%s: region %q unknown or weight %v not in [0, 1e6]", what, r, v)
			}
			sum += v
		}
		if sum <= 0 {
			return fmt.Errorf("%s: no region with a positive weight", what)
		}
		return nil
	}
	names, total := map[string]bool{}, 0
	for i, g := range s.Groups {
		if !policy.RegionNameRE.MatchString(g.Name) || names[g.Name] {
			return fmt.Errorf("group %d: name %q must be 1-63 of a-z, 0-9 and '-', and not repeat", i, g.Name)
		}
		names[g.Name] = true
		if total += g.Tenants; g.Tenants < 1 || total > 1_000_000 {
			return fmt.Errorf("group %q: 1 or more tenants, at most 1,000,000 in all groups", g.Name)
		}
		if math.IsNaN(g.Rate) || g.Rate <= 0 || g.Rate*float64(g.Tenants) > 1e6 {
			return fmt.Errorf("group %q: rate must be positive, at most 1e6 requests/s for the group", g.Name)
		}
		if err := weights("group "+strconv.Quote(g.Name), g.Regions); err != nil {
			return err
		}
		var last policy.Duration = -1
		for j, m := range g.Moves {
			if m.At <= last {
				return fmt.Errorf("group %q: move %d must come after the one before", g.Name, j)
			}
			last = m.At
			if m.Regions == nil && m.Instances == nil {
				return fmt.Errorf("group %q move %d: moves nothing (give regions, instances or both)", g.Name, j)
			}
			if m.Regions == nil {
				continue
			}
			if err := weights(fmt.Sprintf("group %q move %d", g.Name, j), m.Regions); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateEdge checks the edge and the groups' edge traffic: the policy
// states edge settings (what Envoy does without an assignment, and how
// many instances the bound counts), the region runs no more instances
// than that, and only groups send through it.
func (s *Scenario) validateEdge() error {
	sends := false
	for _, g := range s.Groups {
		if math.IsNaN(g.Edge) || g.Edge < 0 || g.Edge > 1 {
			return fmt.Errorf("group %q: edge must be in [0, 1], got %v", g.Name, g.Edge)
		}
		sends = sends || g.Edge > 0
		ws := [][]float64{g.Instances}
		for _, m := range g.Moves {
			ws = append(ws, m.Instances)
		}
		for _, w := range ws {
			if w == nil {
				continue
			}
			if s.Edge == nil || len(w) > s.Edge.Instances {
				return fmt.Errorf("group %q: instance weights need an edge with at least %d instances", g.Name, len(w))
			}
			var sum float64
			for _, v := range w {
				if math.IsNaN(v) || v < 0 || v > 1e6 {
					return fmt.Errorf("group %q: instance weight %v not in [0, 1e6]", g.Name, v)
				}
				sum += v
			}
			if sum <= 0 {
				return fmt.Errorf("group %q: no instance with a positive weight", g.Name)
			}
		}
	}
	if s.Edge == nil {
		if sends {
			return errors.New("a group sends through the edge, but the scenario has none")
		}
		return nil
	}
	e := s.policy.Edge
	if e == nil {
		return errors.New("edge: the policy has no edge settings (policy.edge: instances, no_assignment, ...)")
	}
	if s.Edge.Instances < 1 || s.Edge.Instances > min(e.Instances, MaxEdgeInstances) {
		return fmt.Errorf("edge: 1 to %d instances per region (the policy's edge.instances, which the bound "+
			"counts), got %d", min(e.Instances, MaxEdgeInstances), s.Edge.Instances)
	}
	if s.Edge.Delay < 0 || s.Edge.ReportInterval < policy.Duration(time.Second) {
		return fmt.Errorf("edge: delay must not be negative and report_interval at least 1s")
	}
	if s.Edge.RepayOver != 0 && s.Edge.RepayOver < policy.Duration(time.Second) {
		return fmt.Errorf("edge: repay_over must be at least 1s (0: the agent's default)")
	}
	if s.Edge.ChangeEvery < 0 ||
		math.IsNaN(s.Edge.BurstFraction) || s.Edge.BurstFraction < 0 || s.Edge.BurstFraction >= 1 {
		return fmt.Errorf("edge: change_every must not be negative and burst_fraction must be in [0, 1) (0: the " +
			"agent's default)")
	}
	if len(s.Groups) == 0 || !sends {
		return errors.New("edge: no group sends through it (groups with edge > 0)")
	}
	return nil
}

// Rate is region's generated request rate at t, its failovers applied.
func (s *Scenario) Rate(region string, t time.Duration) float64 {
	own := func(r string) float64 {
		var sum float64
		for _, tr := range s.Traffic {
			if tr.Region == r {
				sum += tr.RateAt(t)
			}
		}
		return sum
	}
	total := own(region)
	for _, e := range s.Events {
		if e.Kind != "failover" || t < time.Duration(e.At) {
			continue
		}
		if e.Region == region {
			total -= own(region) // its traffic has gone elsewhere
		}
		if e.To == region {
			total += own(e.Region)
		}
	}
	return math.Max(0, total)
}

// RateAt is t's rate at now.
func (t Traffic) RateAt(now time.Duration) float64 {
	switch t.Shape {
	case "ramp":
		at, until := time.Duration(t.At), time.Duration(t.Until)
		switch {
		case now <= at:
			return t.Rate
		case now >= until || until <= at:
			return t.To
		default:
			f := float64(now-at) / float64(until-at)
			return t.Rate + (t.To-t.Rate)*f
		}
	case "follow-the-sun":
		day := float64(24 * time.Hour)
		phase := 2 * math.Pi * (float64(now) - float64(time.Duration(t.PeakAt))) / day
		return t.Base + (t.Rate-t.Base)*math.Max(0, math.Cos(phase))
	default:
		return t.Rate
	}
}
