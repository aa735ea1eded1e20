package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// FloodIdentityDemands floods quota's identity plan as region's
// certificate could: workers goroutines, each as instance "flood-<worker>",
// make calls Lease calls through lease, each of leaseapi.MaxIdentityDemands
// new identity demands at 2^62 and claiming that the plan holds all its
// instance sent before; each call may take timeout. Once every call is
// answered it returns the number of identity demands in the calls that
// succeeded and, if any failed, an error naming how many and the first.
// The coordinator's flood test and the one over real processes send the
// same flood.
func FloodIdentityDemands(t testing.TB, lease func(context.Context, *pb.LeaseRequest) (*pb.LeaseResponse, error),
	region, quota string, workers, calls int, timeout time.Duration) (accepted int, err error) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				ids := make(map[string]int64, leaseapi.MaxIdentityDemands)
				for j := range leaseapi.MaxIdentityDemands {
					ids[fmt.Sprintf("tenant=flood-%d-%d-%d", w, i, j)] = 1 << 62
				}
				req := &pb.LeaseRequest{Region: region, Instance: fmt.Sprint("flood-", w), Nonce: "n",
					Quotas: []*pb.QuotaRequest{{Quota: quota, Demand: 1 << 62, IdentityDemand: ids,
						IdentityDemandHeld: int32(i * leaseapi.MaxIdentityDemands), IdentityDeltas: true}}}
				ctx, cancel := context.WithTimeout(t.Context(), timeout)
				_, callErr := lease(ctx, req)
				cancel()
				mu.Lock()
				if callErr == nil {
					accepted += len(ids)
				} else {
					if failed == 0 {
						err = fmt.Errorf("flood call %d of instance %s: %w", i, req.Instance, callErr)
					}
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed > 0 {
		err = fmt.Errorf("%d of %d flood calls failed, the first: %w", failed, workers*calls, err)
	}
	return accepted, err
}
