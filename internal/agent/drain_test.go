package agent

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
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
	testenv.WaitFor(t, 5*time.Second, "checks answered under load", func() bool { return answered.Load() > 0 })
	const delay = 500 * time.Millisecond
	drainFrom := time.Now()
	drained := make(chan struct{})
	go func() { ra.a.Drain(t.Context(), delay); close(drained) }()
	testenv.WaitFor(t, delay, "readyz to answer 503 while draining", func() bool {
		resp, err := http.Get(ra.httpURL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	before := answered.Load()
	testenv.WaitFor(t, delay, "a check answered after readyz turned 503", func() bool { return answered.Load() > before })
	if took := time.Since(drainFrom); took >= delay {
		t.Fatalf("no check seen answered within the drain delay of %v (%v)", delay, took)
	}
	close(stop) // the load balancer has moved the traffic away
	<-drained
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d checks failed during the drain", failed.Load())
	}
}

// A draining agent ends its RLQS streams once its drain delay has passed
// and refuses new ones, so that its Envoy instances reopen theirs
// elsewhere at once and the server's graceful stop does not wait on them
// (it waited out its whole deadline, the drain delay and 10 s more).
func TestDrainEndsRLQSStreams(t *testing.T) {
	ra, in := servedEnvoy(t, startRedis(t).Addr)
	if n := in.Stats().StreamStarts; n != 1 {
		t.Fatalf("%d streams opened before the drain, want 1", n)
	}
	ra.a.Drain(t.Context(), 0)
	testenv.WaitFor(t, 5*time.Second, "the stream ended by the draining agent", func() bool { return in.Stats().StreamsClosed >= 1 })
	// Envoy reopens on its next report; the agent refuses it.
	testenv.WaitFor(t, 5*time.Second, "a new stream refused", func() bool {
		s := in.Stats()
		return s.StreamStarts+s.StreamFailures >= 2 && s.StreamsClosed+s.StreamFailures >= 2
	})
	n := ra.a.edge.Load().Streams
	if n != 0 {
		t.Fatalf("the draining agent holds %d streams", n)
	}
}
