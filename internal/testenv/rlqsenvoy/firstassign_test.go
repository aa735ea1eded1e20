package rlqsenvoy

import (
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv/rlqsfake"
)

// FirstAssignments measures each bucket's first assignment from the last
// report that carried the bucket; later assignments add nothing.
func TestFirstAssignments(t *testing.T) {
	f, clk, in := withBucket(t, nil)
	clk.Set(250)
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(5, 5, time.Second), ttlOf(5*time.Second)))
	f.Push(t, in, 0, rlqsfake.Assignment(tenantA, rlqsfake.TokenBucket(5, 5, time.Second), ttlOf(5*time.Second)))
	if got := in.FirstAssignments(); len(got) != 1 || got[0] != 250*time.Millisecond {
		t.Fatalf("first assignments %v, want [250ms]", got)
	}
}
