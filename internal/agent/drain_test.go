package agent

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
)

// Drain under load: /readyz turns 503 at once while checks keep being
// answered for the drain delay, and Drain returns once the traffic has
// moved away.
// Checks start concurrently with the wait throughout (a WaitGroup would
// have Add racing Wait).
func TestDrainUnderLoad(t *testing.T) {
	ra := regionAgent(t, "name: api\nidentity: [tenant]\nlimit: 100000\nperiod: 1s\nscope: region\n", nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered, failed atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := ra.a.Check(t.Context(), admission.Request{Policy: "api", Attributes: tenantA}); err != nil {
					failed.Add(1)
				} else {
					answered.Add(1)
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	drained := make(chan struct{})
	go func() { ra.a.Drain(t.Context(), 500*time.Millisecond); close(drained) }()
	time.Sleep(100 * time.Millisecond)
	resp, err := http.Get(ra.httpURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz while draining: %d, want 503", resp.StatusCode)
	}
	before := answered.Load()
	time.Sleep(200 * time.Millisecond)
	if answered.Load() == before {
		t.Fatal("checks stopped being answered during the drain delay")
	}
	close(stop) // the load balancer has moved the traffic away
	<-drained
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d checks failed during the drain", failed.Load())
	}
}
