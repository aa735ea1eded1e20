package testenv

import (
	"testing"
	"time"
)

// pollEvery is how often WaitFor evaluates its condition.
const pollEvery = 5 * time.Millisecond

// WaitFor calls ok every few milliseconds until it returns true. If limit
// passes first, WaitFor fails the test, saying it timed out waiting for
// what, and stops it with t.Fatalf; so it must be called from the
// goroutine running the test.
//
// Use WaitFor rather than sleeping and then asserting: it returns as soon
// as the condition holds and only fails when it never does, so a slow
// machine makes a test slower rather than flaky. limit bounds how long a
// failing test hangs; it is not a claim about how fast the code under test
// is, which a test asserts separately when it matters.
func WaitFor(t testing.TB, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(pollEvery)
	}
}
