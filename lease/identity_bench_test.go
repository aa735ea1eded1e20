package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// BenchmarkIdentityRenewal is one region's renewal (PrepareTargets and
// Commit) on a quota whose n identities hold shares of their own in three
// regions, when nothing changes: the coordinator's cost per renewal grows
// with n, since the book checks what is free for every identity.
func BenchmarkIdentityRenewal(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			const total = 100 * policy.Micro
			timing := Timing{ValidFor: 10 * time.Second, Drift: 1e-4, Margin: 10 * time.Millisecond, DegradedTimeout: time.Minute}
			book := NewBook(total, policy.Failure{Mode: policy.StaticShare, StaticFraction: 0.1}, timing, 1)
			regions := []string{"us", "eu", "ap"}
			targets := map[string]Targets{}
			for i, r := range regions {
				t := Targets{Default: total / 3, Identities: map[string]int64{}}
				for k := 0; k < n; k++ {
					if k%3 == i {
						t.Identities[fmt.Sprint("tenant=", k)] = total
					} else {
						t.Identities[fmt.Sprint("tenant=", k)] = 0
					}
				}
				targets[r] = t
			}
			now := time.Unix(1000, 0)
			ids := map[string]string{}
			seq := uint64(0)
			renew := func(r string) {
				seq++
				p, err := book.PrepareTargets(now, Renewal{Region: r, Instance: r, Nonce: "n-" + r, Seq: seq, GrantID: ids[r]}, targets[r])
				if err != nil {
					b.Fatal(err)
				}
				book.Commit(p)
				ids[r] = p.Grant().ID
			}
			for round := 0; round < 3; round++ { // shares settle: every region acknowledges
				for _, r := range regions {
					renew(r)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				renew(regions[i%3])
			}
		})
	}
}

// BenchmarkIdentityRound is the coordinator's work for one quota per
// renewal round with n identities holding shares of their own in three
// regions, each homed in one: a planning round (IdentityPlan.Plan) and
// each region's renewal (its report's changes, its targets,
// PrepareTargets and Commit).
func BenchmarkIdentityRound(b *testing.B) {
	for _, n := range []int{1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			const total = 10 * policy.Micro
			timing := Timing{ValidFor: 10 * time.Second, Drift: 1e-4, Margin: 10 * time.Millisecond, DegradedTimeout: time.Minute}
			book := NewBook(total, policy.Failure{Mode: policy.StaticShare, StaticFraction: 0.1}, timing, 1)
			plan := NewIdentityPlan(n)
			regions := []string{"us", "eu", "ap"}
			defaults := map[string]int64{"us": total / 3, "eu": total / 3, "ap": total / 3}
			reports := make([]map[string]int64, 3)
			for i := range regions {
				reports[i] = map[string]int64{}
				for k := i; k < n; k += 3 {
					reports[i][fmt.Sprint("tenant=", k)] = total * 12 / 10
				}
				plan.Update(regions[i], regions[i], "n", 0, reports[i])
			}
			now := time.Unix(1000, 0)
			ids := map[string]string{}
			seq := uint64(0)
			round := func() {
				plan.Plan(total, 0, defaults)
				for i, r := range regions {
					seq++
					plan.Update(r, r, "n", len(reports[i]), nil)
					p, err := book.PrepareTargets(now, Renewal{Region: r, Instance: r, Nonce: "n-" + r, Seq: seq, GrantID: ids[r]},
						Targets{Default: defaults[r], Identities: plan.Targets(r)})
					if err != nil {
						b.Fatal(err)
					}
					book.Commit(p)
					ids[r] = p.Grant().ID
				}
				now = now.Add(time.Second)
			}
			for k := 0; k < 4; k++ { // shares settle: every region acknowledges
				round()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				round()
			}
		})
	}
}
