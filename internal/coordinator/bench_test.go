package coordinator

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// BenchmarkRenewals measures lease renewals per second through real gRPC
// against a leader on embedded etcd, with steady demand (the common case),
// and reports etcd writes per renewal: the ledger is written only when a
// region's high-water mark rises, so this is close to zero.
func BenchmarkRenewals(b *testing.B) {
	for _, quotas := range []int{1, 10} {
		b.Run(fmt.Sprintf("quotas=%d", quotas), func(b *testing.B) {
			prefix := testenv.Prefix(b)
			r, adm, cl := startLeader(b, prefix, "bench", func(c *Config) { c.Timing.ValidFor = 10 * time.Second })
			names := make([]string, quotas)
			for i := range names {
				names[i] = fmt.Sprintf("q%d", i)
				yaml := fmt.Sprintf("name: %s\nidentity: [tenant]\nlimit: 300\nperiod: 1s\n", names[i])
				setPolicy(b, adm, yaml)
			}
			regions := []string{"us", "eu", "ap"}
			var next atomic.Int64
			_, writesBefore := r.c.Stats()
			var renewals atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb_ *testing.PB) {
				id := next.Add(1)
				region := regions[id%3]
				nonce := fmt.Sprint("bench-", id)
				grants := map[string]string{}
				seq := uint64(0)
				for pb_.Next() {
					seq++
					req := &pb.LeaseRequest{Region: region, Instance: nonce, Nonce: nonce}
					for _, q := range names {
						req.Quotas = append(req.Quotas, &pb.QuotaRequest{Quota: q, GrantId: grants[q], Seq: seq, Demand: 100_000_000})
					}
					resp, err := cl.Lease(context.Background(), req)
					if err != nil {
						b.Error(err)
						return
					}
					for _, g := range resp.Grants {
						grants[g.Quota] = g.GrantId
					}
					renewals.Add(1)
				}
			})
			b.StopTimer()
			_, writesAfter := r.c.Stats()
			n := float64(renewals.Load())
			b.ReportMetric(n/b.Elapsed().Seconds(), "renewals/s")
			b.ReportMetric(float64(writesAfter-writesBefore)/n, "etcd-writes/renewal")
		})
	}
}

// BenchmarkRenewalsTLS is BenchmarkRenewals (one quota) with and without
// mutual TLS and authorization, side by side: the cost of TLS on a
// renewal. Each region's callers present that region's certificate.
func BenchmarkRenewalsTLS(b *testing.B) {
	for _, secure := range []bool{false, true} {
		b.Run(fmt.Sprintf("mtls=%v", secure), func(b *testing.B) {
			var r *replica
			clients := map[string]pb.LeaseServiceClient{}
			regions := []string{"us", "eu", "ap"}
			var adm pb.AdminServiceClient
			if secure {
				p := newPKI(b)
				r = startSecure(b, p)
				adm, _ = dialAs(b, p, r, "admin")
				for _, region := range regions {
					_, clients[region] = dialAs(b, p, r, region)
				}
			} else {
				var cl *leaseapi.Client
				r, adm, cl = startLeader(b, testenv.Prefix(b), "bench", nil)
				cc, err := cl.Conn(r.addr)
				if err != nil {
					b.Fatal(err)
				}
				for _, region := range regions {
					clients[region] = pb.NewLeaseServiceClient(cc)
				}
			}
			setPolicy(b, adm, "name: q\nidentity: [tenant]\nlimit: 300\nperiod: 1s\n")
			var next, renewals atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb_ *testing.PB) {
				id := next.Add(1)
				region := regions[id%3]
				nonce := fmt.Sprint("bench-", id)
				grant, seq := "", uint64(0)
				for pb_.Next() {
					seq++
					resp, err := clients[region].Lease(context.Background(), &pb.LeaseRequest{Region: region, Instance: nonce, Nonce: nonce,
						Quotas: []*pb.QuotaRequest{{Quota: "q", GrantId: grant, Seq: seq, Demand: 100_000_000}}})
					if err != nil {
						b.Error(err)
						return
					}
					grant = resp.Grants[0].GrantId
					renewals.Add(1)
				}
			})
			b.ReportMetric(float64(renewals.Load())/b.Elapsed().Seconds(), "renewals/s")
		})
	}
}
