package scenario

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestBadScenarios(t *testing.T) {
	base := "name: x\nduration: 1m\nregions: [us, eu]\npolicy: {name: p, identity: [api], limit: 10, period: 1s}\ntraffic: [{region: us, rate: 1}]\n"
	cases := []struct{ yaml, want string }{
		{base + "bogus: 1\n", "field bogus not found"},
		{strings.Replace(base, "name: x\n", "", 1), "name is required"},
		{strings.Replace(base, "duration: 1m", "duration: 90", 1), "duration must be a string"},
		{strings.Replace(base, "[us, eu]", "[us, us]", 1), "listed twice"},
		{strings.Replace(base, "limit: 10", "limit: .nan", 1), "policy"},
		{strings.Replace(base, "period: 1s}", "period: 1s, scope: region}", 1), "must be global"},
		{strings.Replace(base, "region: us, rate: 1", "region: mars, rate: 1", 1), "unknown region"},
		{strings.Replace(base, "rate: 1}", "rate: -1}", 1), "rates must be"},
		{strings.Replace(base, "rate: 1}", "rate: 1, shape: zigzag}", 1), "shape"},
		{base + "events: [{kind: meteor}]\n", "unknown kind"},
		{base + "events: [{kind: partition, region: us}]\n", "positive 'for'"},
		{base + "events: [{kind: clock-drift, region: us, rate: 0.1}]\n", "|rate| <= lease.drift"},
		{base + "events: [{kind: failover, region: us, to: us}]\n", "two different"},
		{base + "network: {loss: 1.5}\n", "loss"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "", 1), "nothing to simulate"},
		{base + "groups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}}]\n", "groups replace traffic"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 1, rate: 1, regions: {mars: 1}}]\n", 1), "unknown"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 1, rate: 1, regions: {us: 0}}]\n", 1), "no region with a positive weight"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 0, rate: 1, regions: {us: 1}}]\n", 1), "1 or more tenants"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 1, rate: 0, regions: {us: 1}}]\n", 1), "rate must be positive"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}}, {name: g, tenants: 1, rate: 1, regions: {us: 1}}]\n", 1), "not repeat"},
		{strings.Replace(base, "traffic: [{region: us, rate: 1}]\n", "groups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}, moves: [{at: 2s, regions: {eu: 1}}, {at: 1s, regions: {us: 1}}]}]\n", 1), "after the one before"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.yaml))
		if err == nil || !errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\n want %q", c.yaml, err, c.want)
		}
	}
}

// Bad edge settings are refused with what to change.
func TestBadEdgeScenarios(t *testing.T) {
	base := "name: x\nduration: 1m\nregions: [us]\npolicy: {name: p, identity: [t], limit: 10, period: 1s%s}\n%sgroups: [{name: g, tenants: 1, rate: 1, regions: {us: 1}%s}]\n%s"
	edgePol := ", edge: {instances: 2, no_assignment: deny}"
	cases := []struct{ pol, edge, group, events, want string }{
		{"", "edge: {instances: 1}\n", ", edge: 1", "", "no edge settings"},
		{edgePol, "edge: {instances: 3}\n", ", edge: 1", "", "1 to 2 instances"},
		{edgePol, "", ", edge: 1", "", "has none"},
		{edgePol, "edge: {instances: 2}\n", "", "", "no group sends"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1.5", "", "edge must be in [0, 1]"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, instances: [1, 1, 1]", "", "at least 3 instances"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, instances: [0, 0]", "", "no instance with a positive weight"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1, moves: [{at: 1s}]", "", "moves nothing"},
		{edgePol, "edge: {instances: 2, burst_fraction: 1}\n", ", edge: 1", "", "burst_fraction"},
		{edgePol, "edge: {instances: 2, report_interval: 500ms}\n", ", edge: 1", "", "report_interval"},
		{edgePol, "", "", "events: [{kind: agent-outage, region: us, at: 1s, for: 1s}]\n", "needs an edge"},
		{edgePol, "edge: {instances: 2}\n", ", edge: 1", "events: [{kind: edge-partition, region: us, at: 1s}]\n", "positive 'for'"},
	}
	for _, c := range cases {
		y := fmt.Sprintf(base, c.pol, c.edge, c.group, c.events)
		_, err := Parse([]byte(y))
		if err == nil || !errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s\n got %v\n want %q", y, err, c.want)
		}
	}
}

// Conversations need a policy that takes charges after the fact, and costs
// within its max_cost.
func TestConversationsValidate(t *testing.T) {
	base := `
name: c
duration: 1m
regions: [us]
traffic: [{region: us, rate: 1}]
conversations: {think: {min: 1s, max: 2s}, cost: {distribution: %s, min: 10, max: 500, median: 50, sigma: 1}}
policy: {name: t, identity: [user], algorithm: fixed_window, limit: 1000, period: 1m%s}
`
	for _, c := range []struct{ dist, pol, err string }{
		{"pareto", ", post_hoc: true, max_cost: 500, max_in_flight: 2", ""},
		{"lognormal", ", post_hoc: true", ""},
		{"uniform", "", "post_hoc"},
		{"pareto", ", post_hoc: true, max_cost: 400, max_in_flight: 2", "max_cost"},
		{"zipf", ", post_hoc: true", "distribution"},
	} {
		_, err := Parse([]byte(fillIn(base, c.dist, c.pol)))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s%s: %v", c.dist, c.pol, err)
		case c.err != "" && (!errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s%s: %v, want an error about %s", c.dist, c.pol, err, c.err)
		}
	}
}

// fillIn puts the distribution and the policy's extra fields into base.
func fillIn(base, dist, pol string) string {
	base = strings.Replace(base, "%s", dist, 1)
	return strings.Replace(base, "%s", pol, 1)
}
