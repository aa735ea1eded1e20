package scenario

import (
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// EdgeSpec is the scenario's edge: Envoy instances behind every region.
type EdgeSpec struct {
	// Instances per region; default and at most the policy's
	// edge.instances (the bound's edge term counts that many).
	Instances int `yaml:"instances"`
	// Delay is the one-way delay between an instance and its agent.
	// Default 1ms.
	Delay policy.Duration `yaml:"delay"`
	// ReportInterval is Envoy's report period: 5s, hard-coded in Envoy.
	ReportInterval policy.Duration `yaml:"report_interval"`
	// ChangeEvery, BurstFraction and RepayOver override the agent's
	// defaults (edge.DefaultConfig): the least time between changes of one
	// bucket's assignment, the most of its refill given up to pay for
	// buckets that start full, and the time over which it pays
	// (edge/tokens: Assign, Resize).
	ChangeEvery   policy.Duration `yaml:"change_every"`
	BurstFraction float64         `yaml:"burst_fraction"`
	RepayOver     policy.Duration `yaml:"repay_over"`
	// OldEnvoy runs Envoy from before PR #37624, whose replaced token
	// buckets start full, and the agent set for it
	// (--edge-envoy-keeps-fill=false).
	OldEnvoy bool `yaml:"old_envoy"`
}

// EnvoyReportInterval is the report period of Envoy's rate limit quota
// filter, whatever its settings say (filter_persistence.cc).
const EnvoyReportInterval = 5 * time.Second

// MaxEdgeInstances bounds the instances a region may run in a scenario.
const MaxEdgeInstances = 1000
