package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/policy"
)

// reservingStore decides tickets with the pure transitions, keeping each
// admitted reservation's record by key, as the region's store does.
type reservingStore struct {
	clk   *clock.Manual
	state policy.State
	held  map[string]policy.Reserved
}

func (s *reservingStore) decide(t *Ticket) Decided {
	now := s.clk.Now().UnixMilli()
	var ns policy.State
	var d policy.Decision
	var err error
	switch r, ok := s.held[t.IdempotencyKey]; {
	case t.Estimate > 0 && ok:
		delete(s.held, t.IdempotencyKey)
		ns, d, err = policy.Settle(s.state, t.Limits, now, r, t.Cost*policy.Micro)
	case t.Estimate > 0:
		ns, d, err = policy.Apply(s.state, t.Limits, now, t.Charged()*policy.Micro)
	default:
		ns, d, err = policy.Apply(s.state, t.Limits, now, t.Cost*policy.Micro)
		if err == nil && t.Reserve && d.Allowed {
			s.held[t.IdempotencyKey] = policy.Reserved{Cost: t.Cost * policy.Micro, AtMs: ns.LastMs}
		}
	}
	s.state = ns
	return Decided{Decision: d, Err: err}
}

// A reservation is a charge that must fit, named in its outcome; its
// settlement gives back what the estimate exceeded the actual cost by,
// or charges the excess, counted whether or not it fits. Bad reservations
// and settlements are refused before the store.
func TestReservations(t *testing.T) {
	var clk clock.Manual
	clk.Set(1_000_000)
	rs := &reservingStore{clk: &clk, held: map[string]policy.Reserved{}}
	store := &fakeStore{decide: rs.decide}
	p := postHocPipeline(t, store, &clk)
	ctx := context.Background()
	ask := func(r Request) Outcome {
		t.Helper()
		r.Policy, r.Attributes = "tokens", tenant
		o, err := p.Check(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	o := ask(Request{Reserve: true, Cost: 600})
	if !o.Allowed || !strings.HasPrefix(o.Reservation, "600.") || len(o.Reservation) < 20 {
		t.Fatalf("a reservation of 600: %+v, want admitted and named 600.<random key>", o)
	}
	if o2 := ask(Request{Reserve: true, Cost: 600}); o2.Allowed || o2.Reservation != "" || rs.state.Count != 600*policy.Micro {
		t.Fatalf("a second reservation of 600 of 1000: %+v, count %d, want refused, unnamed, nothing counted", o2, rs.state.Count)
	}
	if s := ask(Request{Settle: o.Reservation, Cost: 450}); !s.Allowed || rs.state.Count != 450*policy.Micro {
		t.Fatalf("settled at 450: %+v, count %d, want 150 given back", s, rs.state.Count)
	}
	if s := ask(Request{Settle: o.Reservation, Cost: 450}); !s.Allowed || s.Via != ViaReplay || rs.state.Count != 450*policy.Micro {
		t.Fatalf("the settlement retried: %+v, count %d, want it answered again", s, rs.state.Count)
	}
	mine := ask(Request{Reserve: true, Cost: 500, IdempotencyKey: "req-7"})
	if mine.Reservation != "500.req-7" {
		t.Fatalf("a reservation keyed req-7: %+v", mine)
	}
	if s := ask(Request{Settle: mine.Reservation, Cost: 800}); s.Allowed || rs.state.Count != 1250*policy.Micro {
		t.Fatalf("settled at 800 of 500 reserved: %+v, count %d, want 300 more counted, refused (over)", s, rs.state.Count)
	}
	asked := store.asked
	for _, bad := range []Request{
		{Settle: "600"}, {Settle: "x.k"}, {Settle: "0.k"}, {Settle: "5."}, {Settle: "5.a b"}, {Settle: "-5.k"},
		{Settle: "5.k", IdempotencyKey: "other"}, {Settle: "5.k", Check: true}, {Reserve: true, Settle: "5.k"},
		{Reserve: true, Check: true}, {Reserve: true, Cost: 1001}, {Settle: "5.k", Cost: -1},
	} {
		bad.Policy, bad.Attributes = "tokens", tenant
		if _, err := p.Check(ctx, bad); !IsInputError(err) {
			t.Errorf("%+v: %v, want bad input", bad, err)
		}
	}
	if store.asked != asked {
		t.Errorf("bad reservations reached the store %d times", store.asked-asked)
	}
}

// Reservations need a policy that takes charges after the fact.
func TestReservationNeedsPostHoc(t *testing.T) {
	var clk clock.Manual
	p, _ := pipeline(t, &fakeStore{decide: func(*Ticket) Decided { return Decided{} }}, &clk, nil)
	_, err := p.Check(context.Background(), Request{Policy: "api", Attributes: tenant, Reserve: true})
	if !IsInputError(err) || !strings.Contains(err.Error(), "post_hoc") {
		t.Fatalf("a reservation of a plain policy: %v, want bad input naming post_hoc", err)
	}
}

// A reservation's name parses, or is bad input; never a panic; what
// parses names itself again.
func FuzzParseReservation(f *testing.F) {
	for _, s := range []string{"600.k", "1.a.b", "0.k", "5.", ".k", "x.k", "9223372036854775807.k", "600.k\x00", "-1.k", "600.6JQ4HZ3WK2NRX7TB5YQ2M4D8FA"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		e, key, err := parseReservation(name)
		if err != nil {
			if !IsInputError(err) {
				t.Fatalf("%q: %v, not bad input", name, err)
			}
			return
		}
		if e < 1 || e > policy.MaxCapacity/policy.Micro || ValidIdempotencyKey(key) != nil || reservationName(e, key) != name {
			t.Fatalf("%q parsed as %d, %q", name, e, key)
		}
	})
}
