package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// benchRenewer returns a function that renews region r's one instance (named
// r) at now with targets on a new book of total micro-units, and commits it,
// failing t if the book refuses: the renewal both identity benchmarks time.
// Each renewal carries the next sequence number and the grant the region's
// last one got.
func benchRenewer(t testing.TB, total int64) func(now time.Time, r string, targets Targets) {
	t.Helper()
	timing := Timing{ValidFor: 10 * time.Second, Drift: 1e-4, Margin: 10 * time.Millisecond, DegradedTimeout: time.Minute}
	book := NewBook(total, policy.Failure{Mode: policy.StaticShare, StaticFraction: 0.1}, timing, 1)
	ids := map[string]string{}
	seq := uint64(0)
	return func(now time.Time, r string, targets Targets) {
		seq++
		renewal := Renewal{Region: r, Instance: r, Nonce: "n-" + r, Seq: seq, GrantID: ids[r]}
		p, err := book.PrepareTargets(now, renewal, targets)
		if err != nil {
			t.Fatal(err)
		}
		book.Commit(p)
		ids[r] = p.Grant().ID
	}
}

// BenchmarkIdentityRenewal is one region's renewal (PrepareTargets and
// Commit) on a quota whose n identities hold shares of their own in three
// regions, when nothing changes: the coordinator's cost per renewal grows
// with n, since the book checks what is free for every identity.
func BenchmarkIdentityRenewal(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("identities=%d", n), func(b *testing.B) {
			const total = 100 * policy.Micro
			renew := benchRenewer(b, total)
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
			for round := 0; round < 3; round++ { // shares settle: every region acknowledges
				for _, r := range regions {
					renew(now, r, targets[r])
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := regions[i%3]
				renew(now, r, targets[r])
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
			renew := benchRenewer(b, total)
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
			round := func() {
				plan.Plan(total, 0, defaults)
				for i, r := range regions {
					plan.Update(r, r, "n", len(reports[i]), nil)
					renew(now, r, Targets{Default: defaults[r], Identities: plan.Targets(r)})
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
