package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// The replay cache answers a key with its first outcome for the window,
// then forgets it; it holds at most max keys, dropping the oldest; and a
// key put again after it expired is not dropped by its first put's turn.
func TestReplayCache(t *testing.T) {
	now := time.Now()
	r := newReplay(10*time.Second, 3)
	first := Outcome{Decision: policy.Decision{Allowed: true}}
	r.put("a", first, now)
	r.put("a", Outcome{}, now.Add(time.Second)) // a retry's outcome is not recorded
	if o, ok := r.get("a", now.Add(9*time.Second)); !ok || !o.Allowed {
		t.Fatalf("within the window: %+v %v, want the first outcome", o, ok)
	}
	if _, ok := r.get("a", now.Add(10*time.Second)); ok {
		t.Fatal("answered after the window")
	}
	for i := 0; i < 4; i++ {
		r.put(fmt.Sprint("k", i), first, now.Add(time.Second))
	}
	if len(r.m) > 3 {
		t.Fatalf("%d keys held, max 3", len(r.m))
	}
	if _, ok := r.get("k0", now.Add(time.Second)); ok {
		t.Fatal("the oldest key was kept past max")
	}
	// "a" expired at +10 s; put again at +11 s, its first queue entry must
	// not take the new one with it.
	r.put("a", first, now.Add(11*time.Second))
	r.put("b", first, now.Add(12*time.Second))
	if _, ok := r.get("a", now.Add(12*time.Second)); !ok {
		t.Fatal("a key put again after expiring was dropped by its old entry")
	}
}
