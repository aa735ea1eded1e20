package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// BenchmarkIdentityRenewal is one region's renewal (PrepareTargets and
// Commit) on a quota whose n identities hold shares of their own in three
// regions: the coordinator's cost per renewal grows with n, since each
// renewal's grant carries every identity and the book scans every
// outstanding grant.
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
