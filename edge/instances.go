package edge

import "github.com/quota-lease/quota-lease/policy"

// MostInstances is how many Envoy instances of one identity of p an agent
// serves when its region runs agents of them: the policy's instances per
// region (edge.instances, what the bound's edge term counts) divided among
// the agents, rounded up, so that a region serves at most that many
// whatever connects when the policy's instances are a multiple of its
// agents (and at most agents-1 more otherwise). An instance beyond it gets
// no assignment, and so keeps the policy's no_assignment behaviour.
func MostInstances(p *policy.Policy, agents int) int {
	agents = max(1, agents)
	return (p.Edge.Instances + agents - 1) / agents
}
