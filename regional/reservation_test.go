package regional

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// reservationTicket is a ticket of h's policy for alg under limits l:
// a reservation of cost under key, a settlement of the reservation key
// of estimate with cost, or (neither) a charge after the fact.
func (h *harness) reservationTicket(l policy.Limits, tenant, key string, cost, estimate int64, reserve bool) *admission.Ticket {
	p, _ := h.eng.Policy(algPolicy[l.Algorithm])
	id, _ := p.IdentityOf(map[string]string{"tenant": tenant})
	t := &admission.Ticket{Policy: p, Identity: id, Cost: cost, Limits: l, IdempotencyKey: key, Reserve: reserve, Estimate: estimate}
	if reserve {
		t.Limits.PostHoc = false
	}
	return t
}

func (h *harness) decideTicket(nowMs int64, t *admission.Ticket) policy.Decision {
	h.t.Helper()
	h.now.Set(nowMs)
	r := h.eng.Decide(context.Background(), []*admission.Ticket{t})[0]
	if r.Err != nil {
		h.t.Fatalf("at %d: %v", nowMs, r.Err)
	}
	return r.Decision
}

// Reservations and their settlements, mixed with charges after the fact
// and checks at random, in every algorithm: the scripts and the pure
// transitions (policy.Settle) agree on every decision and on the state,
// step by step; a settlement replayed is answered again and changes
// nothing; one whose reservation is gone charges its excess and gives
// nothing back.
func TestDifferentialReservations(t *testing.T) {
	h := newHarness(t)
	for i := range 24 {
		r := rand.New(rand.NewPCG(uint64(i), 11))
		l := randomLimits(r, i)
		l.PostHoc = true
		t.Run(fmt.Sprintf("%d/%s", i, l.Algorithm), func(t *testing.T) {
			h.t = t
			h.fresh(false)
			tenant := fmt.Sprintf("rsv-%d", i)
			capUnits := l.Capacity / policy.Micro
			var s policy.State
			type open struct {
				key string
				r   policy.Reserved
			}
			var outstanding []open
			type done struct {
				key string
				d   policy.Decision
			}
			var settled []done
			now := r.Int64N(1 << 40)
			for j := range 60 {
				now += r.Int64N(max(2, l.WindowMs/3, 700))
				var tk *admission.Ticket
				var ns policy.State
				var want policy.Decision
				var err error
				switch op := r.IntN(10); {
				case op < 4 || len(outstanding) == 0: // reserve
					est := r.Int64N(max(1, capUnits)) + 1
					key := fmt.Sprintf("k%d", j)
					tk = h.reservationTicket(l, tenant, key, est, 0, true)
					nl := l
					nl.PostHoc = false
					if ns, want, err = policy.Apply(s, nl, now, est*policy.Micro); err == nil && want.Allowed {
						outstanding = append(outstanding, open{key, policy.Reserved{Cost: est * policy.Micro, AtMs: ns.LastMs}})
					}
				case op < 8: // settle one
					k := r.IntN(len(outstanding))
					o := outstanding[k]
					outstanding = append(outstanding[:k], outstanding[k+1:]...)
					actual := r.Int64N(2*o.r.Cost/policy.Micro + 1)
					tk = h.reservationTicket(l, tenant, o.key, actual, o.r.Cost/policy.Micro, false)
					ns, want, err = policy.Settle(s, l, now, o.r, actual*policy.Micro)
					settled = append(settled, done{o.key, want})
				case op < 9: // a charge after the fact
					cost := r.Int64N(capUnits + 1)
					tk = h.reservationTicket(l, tenant, "", cost, 0, false)
					ns, want, err = policy.Apply(s, l, now, cost*policy.Micro)
				default: // a settlement retried: answered again, nothing changes
					if len(settled) == 0 {
						continue
					}
					sd := settled[r.IntN(len(settled))]
					tk = h.reservationTicket(l, tenant, sd.key, 1, 1, false)
					ns, want = s, sd.d
					want.Replayed = true
					if l.Algorithm == policy.FixedWindow { // the harness reads a window's time off the engine's floor, which every decision raises
						ns.LastMs = max(ns.LastMs, now)
					}
				}
				if err != nil {
					t.Fatalf("step %d: pure: %v", j, err)
				}
				got := h.decideTicket(now, tk)
				if got != want {
					t.Fatalf("step %d (t=%d, %+v): redis %+v, pure %+v", j, now, *tk, got, want)
				}
				if rs := h.state(l.Algorithm, tenant); !equalState(rs, ns) {
					t.Fatalf("step %d (%+v): redis state %+v, pure state %+v", j, *tk, rs, ns)
				}
				s = ns
			}
		})
	}
}

// A settlement whose reservation the store does not hold (expired, never
// made here) charges what its cost exceeds the named estimate by, counted
// whether or not it fits, and gives nothing back; answered again when
// retried.
func TestSettlementWithoutReservation(t *testing.T) {
	h := newHarness(t)
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 100 * policy.Micro, WindowMs: 3_600_000, PostHoc: true}
	at := int64(3_600_000 * 1000)
	if d := h.decideTicket(at, h.reservationTicket(l, "gone", "", 40, 0, false)); !d.Allowed {
		t.Fatalf("a charge of 40: %+v", d)
	}
	d := h.decideTicket(at+1, h.reservationTicket(l, "gone", "never-made", 10, 50, false))
	if !d.Allowed || d.Remaining != 60*policy.Micro {
		t.Fatalf("a settlement of 10 for an unknown estimate of 50: %+v, want allowed, nothing given back (60 left)", d)
	}
	d = h.decideTicket(at+2, h.reservationTicket(l, "gone", "never-made-2", 130, 50, false))
	if d.Allowed || d.Debt != 20*policy.Micro {
		t.Fatalf("a settlement of 130 for an unknown estimate of 50: %+v, want 80 charged, refused, 20 over", d)
	}
	again := h.decideTicket(at+3, h.reservationTicket(l, "gone", "never-made-2", 130, 50, false))
	if !again.Replayed || again.Debt != 20*policy.Micro {
		t.Fatalf("the settlement retried: %+v, want it answered again, nothing charged", again)
	}
}

// A settlement is answered again, uncharged, as long as its reservation's
// record may live, and a reservation retried after its settlement is
// answered from its record, reserving nothing more; a refused reservation
// is remembered only for the idempotency window, and its settlement (in
// shadow mode, where it was admitted) charges the whole actual cost; a
// settlement of a reservation the store never held that exceeds nothing
// is admitted, and again when retried.
func TestReservationRecords(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	l := policy.Limits{Algorithm: policy.FixedWindow, Capacity: 100 * policy.Micro, WindowMs: 3_600_000, PostHoc: true}
	at := int64(3_600_000 * 1000)
	key := h.key(policy.FixedWindow, "rec")
	if d := h.decideTicket(at, h.reservationTicket(l, "rec", "r1", 60, 0, true)); !d.Allowed {
		t.Fatalf("a reservation of 60: %+v", d)
	}
	if d := h.decideTicket(at+1, h.reservationTicket(l, "rec", "r1", 40, 60, false)); !d.Allowed || d.Remaining != 60*policy.Micro {
		t.Fatalf("settled at 40: %+v, want 60 left", d)
	}
	if ttl := h.rdb.PTTL(ctx, key+":s:r1").Val(); ttl <= DefaultIdempotencyWindow {
		t.Errorf("the settlement is remembered %v, no longer than the idempotency window: a later retry would charge again", ttl)
	}
	if d := h.decideTicket(at+2, h.reservationTicket(l, "rec", "r1", 60, 0, true)); !d.Allowed || !d.Replayed {
		t.Errorf("the reservation retried after its settlement: %+v, want it answered again", d)
	}
	if d := h.decideTicket(at+3, h.reservationTicket(l, "rec", "r2", 90, 0, true)); d.Allowed {
		t.Fatalf("a reservation of 90 with 60 left: %+v, want refused", d)
	}
	if ttl := h.rdb.PTTL(ctx, key+":i:r2").Val(); ttl > DefaultIdempotencyWindow {
		t.Errorf("a refused reservation is remembered %v, beyond the idempotency window", ttl)
	}
	if d := h.decideTicket(at+4, h.reservationTicket(l, "rec", "r2", 30, 90, false)); !d.Allowed || d.Remaining != 30*policy.Micro {
		t.Errorf("a refused reservation settled at 30: %+v, want the 30 charged (30 left)", d)
	}
	for i := range 2 {
		if d := h.decideTicket(at+5, h.reservationTicket(l, "rec", "never", 10, 50, false)); !d.Allowed {
			t.Errorf("try %d: a settlement below the estimate of a reservation never made: %+v, want admitted", i, d)
		}
	}
	if st := h.state(policy.FixedWindow, "rec"); st.Count != 70*policy.Micro {
		t.Errorf("count %d, want 70: 40 settled and 30 charged", st.Count)
	}
}
