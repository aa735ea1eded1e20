package ratelimitxds_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/xdsserver"
)

// logLines counts the warnings a logger was given.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logLines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// A management server that sends a rejected configuration again after
// every NACK is NACKed at a pace that halves as it goes on (backoff up to
// its most, here 200 ms), not as fast as both can go, and the repeated
// rejection is logged at the 1st, 2nd, 4th, 8th ... repetition only.
func TestNacksArePaced(t *testing.T) {
	bad := perMinute("b", 10)
	bad.Descriptors[0].RateLimit.RequestsPerUnit = 0
	bad.Descriptors[0].RateLimit.Unit = 0
	res, err := anypb.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	srv := xdsserver.StartResender(t, res)

	var logs logLines
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	r := &recorder{}
	cl, err := ratelimitxds.NewClient(*xdsserver.Settings(srv.Addr, nil), r.apply, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { cl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	testenv.WaitFor(t, 10*time.Second, "ten NACKs", func() bool { return srv.NACKs() >= 10 })
	began, before := time.Now(), srv.NACKs()
	testenv.WaitFor(t, 10*time.Second, "ten more NACKs", func() bool { return srv.NACKs() >= before+10 })
	// At the most backoff (200 ms) ten NACKs take about 2 s; unpaced, a
	// loopback server and client make thousands a second.
	if took := time.Since(began); took < 10*100*time.Millisecond {
		t.Errorf("ten NACKs of the same rejection within %v: not paced", took)
	}
	if n := logs.count(); n > 8 {
		t.Errorf("%d log lines for %d NACKs of one rejection; want one at each power of two: %v", n, srv.NACKs(), logs.lines)
	}
	if _, n := r.last(); n != 0 {
		t.Errorf("a rejected configuration was applied %d times", n)
	}
}
