package envoy

import (
	"math"
	"testing"
	"time"
)

const s = time.Second

func tb(maxTokens, perFill uint32, every time.Duration) Strategy {
	return Strategy{Kind: TokenBucket, Bucket: TokenBucketConfig{MaxTokens: maxTokens, TokensPerFill: perFill, FillInterval: every}}
}

// allowN decides n requests at now and returns how many were allowed.
func allowN(b *Bucket, n int, now time.Duration) int {
	ok := 0
	for range n {
		if b.Allow(now) {
			ok++
		}
	}
	return ok
}

// A first assignment starts full; a replacement starts at the old
// bucket's fill ratio of its new size; an unchanged one keeps its tokens.
func TestTokenBucketStarts(t *testing.T) {
	set := &Settings{NoAssignment: Strategy{Kind: DenyAll}}
	b := New(set, 0)
	if set.FirstAllowed() || b.Allow(0) {
		t.Fatal("DENY_ALL before any assignment must deny")
	}
	b.Assign(tb(10, 1, s), 60*s, 0)
	if got := allowN(b, 20, 0); got != 10 {
		t.Fatalf("a first token bucket starts full: %d of 10 allowed", got)
	}
	if got := allowN(b, 5, 2*s); got != 2 {
		t.Fatalf("refill 1/s: %d allowed after 2s, want 2", got)
	}
	// Half full now (5 of 10 after 5 more seconds), replaced by a 40-token bucket: 20.
	b.Assign(tb(40, 1, s), 60*s, 7*s)
	if st := b.State(7 * s); st.Tokens != 20 {
		t.Fatalf("a replacement starts at the old fill ratio: %v tokens, want 20", st.Tokens)
	}
	// The same configuration again (only the TTL is new): tokens kept.
	allowN(b, 15, 7*s)
	b.Assign(tb(40, 1, s), 60*s, 7*s)
	if st := b.State(7 * s); st.Tokens != 5 {
		t.Fatalf("an unchanged bucket keeps its tokens: %v, want 5", st.Tokens)
	}
	// Only the seconds of the fill interval changed: Envoy keeps the old limiter and rate.
	b.Assign(tb(40, 1, 3*s), 60*s, 7*s)
	if st := b.State(8 * s); st.Tokens != 6 {
		t.Fatalf("a fill interval changed in its seconds alone keeps the old rate: %v tokens, want 6", st.Tokens)
	}
	// After a blanket rule there is no limiter: the next token bucket starts full.
	b.Assign(Strategy{Kind: AllowAll}, 60*s, 9*s)
	b.Assign(tb(7, 1, s), 60*s, 9*s)
	if st := b.State(9 * s); st.Tokens != 7 {
		t.Fatalf("a token bucket after a blanket rule starts full: %v", st.Tokens)
	}
}

// Timers are whole seconds: an assignment expires into the fallback, which
// expires into the default action; under a second it expires at once.
func TestExpiry(t *testing.T) {
	fb := tb(3, 1, s)
	set := &Settings{NoAssignment: Strategy{Kind: DenyAll}, Fallback: &fb, FallbackFor: 10*s + 900*time.Millisecond}
	b := New(set, 0)
	b.Assign(Strategy{Kind: AllowAll}, 2*s+999*time.Millisecond, 0)
	if st := b.State(1999 * time.Millisecond); st.Phase != Assigned || st.Until != 2*s {
		t.Fatalf("the TTL counts whole seconds: %+v", st)
	}
	st := b.State(2 * s)
	if st.Phase != Fallback || st.Until != 12*s || st.Tokens != 3 {
		t.Fatalf("expired into a full fallback for 10s: %+v", st)
	}
	if got := allowN(b, 10, 3*s) + allowN(b, 10, 5*s); got != 3+2 {
		t.Fatalf("fallback token bucket (3 tokens, 1/s): %d allowed, want 5", got)
	}
	if st := b.State(12 * s); st.Phase != Default || b.Allow(12*s) {
		t.Fatalf("after the fallback the default action (deny): %+v", st)
	}
	b.Assign(Strategy{Kind: AllowAll}, 900*time.Millisecond, 20*s)
	if st := b.State(20 * s); st.Phase != Fallback || st.Until != 30*s {
		t.Fatalf("a TTL under a second expires at once, into the fallback: %+v", st)
	}
	// A fallback equal to the expired token bucket keeps its tokens.
	b = New(set, 0)
	b.Assign(fb, 5*s, 0)
	allowN(b, 3, 0)
	if st := b.State(5 * s); st.Phase != Fallback || math.Abs(st.Tokens-3) > 1e-9 {
		t.Fatalf("an equal fallback keeps the limiter (refilled 3 in 5s, capped): %+v", st)
	}
	b = New(set, 0)
	b.Assign(fb, 5*s, 0)
	allowN(b, 3, 4*s)
	if st := b.State(5 * s); st.Tokens != 1 {
		t.Fatalf("an equal fallback keeps the limiter's tokens: %+v", st)
	}
}

// requests_per_time_unit and unset strategies are ignored as assignments
// (the bucket keeps its action and deadline) and allow all as defaults.
func TestUnsupported(t *testing.T) {
	set := &Settings{}
	b := New(set, 0)
	if !set.FirstAllowed() || !b.Allow(0) {
		t.Fatal("an unset no-assignment behaviour allows all")
	}
	b.Assign(Strategy{Kind: DenyAll}, 5*s, 0)
	if b.Assign(Strategy{Kind: Unsupported}, 60*s, 1*s) {
		t.Fatal("requests_per_time_unit applied")
	}
	if st := b.State(4 * s); st.Phase != Assigned || st.Strategy.Kind != DenyAll || st.Until != 5*s {
		t.Fatalf("an ignored assignment changed the bucket: %+v", st)
	}
	b.AssignNothing(4 * s)
	if st := b.State(4 * s); st.Phase != Default || !b.Allow(4*s) {
		t.Fatalf("an empty action expires at once: %+v", st)
	}
	if (&Settings{NoAssignment: Strategy{Kind: Unsupported}}).FirstAllowed() != true {
		t.Fatal("only DENY_ALL denies a first request")
	}
}

// A usage report holds the counts since the last one, then resets them;
// its time is whole seconds.
func TestUsage(t *testing.T) {
	b := New(&Settings{}, 0)
	b.Count(true)
	if a, d, e := b.Usage(0); a != 1 || d != 0 || e != 0 {
		t.Fatalf("first report: %d %d %s", a, d, e)
	}
	b.Allow(s)
	b.Assign(Strategy{Kind: DenyAll}, 10*s, s)
	b.Allow(2 * s)
	if a, d, e := b.Usage(4999 * time.Millisecond); a != 1 || d != 1 || e != 4*s {
		t.Fatalf("second report: %d %d %s, want 1 1 4s", a, d, e)
	}
	if a, d, _ := b.Usage(6 * s); a != 0 || d != 0 {
		t.Fatal("counts not reset")
	}
}

// A fill interval under a second is Envoy's division by zero: always full.
// An unset tokens_per_fill is Envoy's 0, one token a year.
func TestFillRateQuirks(t *testing.T) {
	b := New(&Settings{}, 0)
	b.Assign(tb(2, 5, 500*time.Millisecond), 60*s, 0)
	if got := allowN(b, 100, s); got != 100 {
		t.Fatalf("sub-second fill interval: %d of 100 allowed, want all", got)
	}
	b.Assign(tb(1, 0, s), 7200*s, 2*s)
	if got := allowN(b, 1, 2*s) + allowN(b, 1, 3600*s); got != 1 {
		t.Fatalf("tokens_per_fill 0 refills nothing in an hour: %d allowed, want 1", got)
	}
}
