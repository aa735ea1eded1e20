package agent

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/lease"
)

// 1,500 global policies, more than one lease request may name, are all
// leased: the agent splits its renewals. Before, the coordinator refused
// the one request and every policy degraded at once.
func TestManyPoliciesAllLeased(t *testing.T) {
	const n = 1500
	var sets []string
	for part := 0; part < n/100; part++ { // at most 100 per quota set
		var b strings.Builder
		for i := part * 100; i < (part+1)*100; i++ {
			fmt.Fprintf(&b, "---\nname: p%04d\nidentity: [tenant]\nlimit: 100\nperiod: 1s\n", i)
		}
		sets = append(sets, b.String())
	}
	k := policyCoordinator(t, sets...)
	ra := startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, nil)
	testenv.WaitFor(t, 30*time.Second, "every policy leased", func() bool {
		for i := 0; i < n; i++ {
			if _, m := ra.a.leaser.Enforce(fmt.Sprintf("p%04d", i), "", time.Now()); m != lease.ModeLeased {
				return false
			}
		}
		return true
	})
}
