package coordinator

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// steppingClock is a clock whose wall time an operator (or NTP) can step,
// while its monotonic reading goes on as real time does.
type steppingClock struct {
	origin time.Time
	offset atomic.Int64 // wall-clock step, nanoseconds
	mono   atomic.Int64 // when set (>0), a fixed monotonic reading
}

func newSteppingClock() *steppingClock { return &steppingClock{origin: time.Now()} }

func (c *steppingClock) Now() time.Time {
	return time.Now().Round(0).Add(time.Duration(c.offset.Load())) // wall only: no monotonic reading
}

func (c *steppingClock) Mono() time.Duration {
	if m := c.mono.Load(); m > 0 {
		return time.Duration(m)
	}
	return time.Since(c.origin)
}

func (c *steppingClock) step(d time.Duration) { c.offset.Add(int64(d)) }

// The leadership lease ends when its monotonic deadline passes, whatever
// the wall clock does meanwhile: a wall clock stepped back an hour must not
// let an old leader keep granting past its etcd session.
func TestLeadershipLeaseIgnoresWallClockSteps(t *testing.T) {
	c := newSteppingClock()
	var l leaderLease
	c.mono.Store(int64(time.Second))
	sent := c.Mono()
	l.extend(sent, 5*time.Second, 1e-4, 100*time.Millisecond) // valid for 5s - 1ms - 100ms
	c.step(-time.Hour)
	c.mono.Store(int64(sent + 4800*time.Millisecond))
	if !l.valid(c.Mono()) {
		t.Fatal("lease invalid 4.8 s into a 4.899 s lease")
	}
	c.mono.Store(int64(sent + 4900*time.Millisecond))
	if l.valid(c.Mono()) {
		t.Fatal("lease still valid past its monotonic deadline after the wall clock stepped back an hour")
	}
	// Stepping forward does not end a live one either.
	l.extend(c.Mono(), 5*time.Second, 1e-4, 100*time.Millisecond)
	c.step(2 * time.Hour)
	if !l.valid(c.Mono()) {
		t.Fatal("lease ended by a wall-clock step forwards")
	}
}

// A leading replica whose wall clock steps back an hour, then forward two,
// keeps serving leases: its leadership lease runs on the monotonic clock.
func TestLeaderServesAcrossWallClockSteps(t *testing.T) {
	prefix := testenv.Prefix(t)
	clk := newSteppingClock()
	// A longer session: on a loaded machine a 2 s session can lapse between
	// keepalives, which ends leadership for a reason that is not the step
	// (the grant presented then is stale). A step that ended leadership
	// would still show, whatever the session's length.
	_, adm, cl := startLeader(t, prefix, "a", func(c *Config) { c.Clock, c.SessionTTL = clk, 5*time.Second })
	setPolicy(t, adm, policy100)
	ta := newTestAgent(t, cl, "us", "api", 100_000_000)
	for _, step := range []time.Duration{0, -time.Hour, 2 * time.Hour} {
		clk.step(step)
		for i := 0; i < 3; i++ { // across a keepalive (every 5/3 s)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := ta.renew(ctx)
			cancel()
			if err != nil {
				t.Fatalf("after a wall-clock step of %v: %v", step, err)
			}
			// Real time passes on purpose: the session's keepalives (every
			// 5/3 s) must go on across the step, which no event exposes.
			time.Sleep(700 * time.Millisecond)
		}
	}
}
