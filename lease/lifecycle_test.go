package lease

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// TestIdentitySharesLifecycle holds the per-identity safety property (no
// identity's regions may be enforcing more than its limit, as the
// coordinator books them, and no agent enforces more for an identity than
// the coordinator books for it) through what the plain random schedules
// leave out:
//   - agents restarting from their saved grant (a new process: Restore);
//   - leader changes (a new Book, restored from the ledger marks written
//     as the coordinator writes them to etcd, on another clock);
//   - answers lost for seconds while requests arrive, so that more than
//     maxOutstanding grants are out and the book folds them;
//   - limit changes (SetQuota), which agents learn some grants later;
//   - grants sent as changes to the grant the agent presented
//     (Pending.Base, DiffIdentities, ApplyIdentities), rebuilt by the agent;
//   - agents that acknowledge only grants they saved, saves that fail, and
//     refusals of the acknowledged grant (it is never presented again).
func TestIdentitySharesLifecycle(t *testing.T) {
	for seed := uint64(1); seed <= 16; seed++ {
		f := scheduleModes[seed%uint64(len(scheduleModes))]
		t.Run(fmt.Sprintf("seed%d/%s", seed, f.Mode), func(t *testing.T) {
			runLifecycle(t, seed, f)
		})
	}
}

// lifeAgent is one region's agent process and what it saved.
type lifeAgent struct {
	h          *Holder
	nonce      string
	clock      clock
	saved      Grant // the grant the region's store holds, restored by a new process
	savedUntil time.Time
	durable    Grant // the grant it acknowledges: the last one saved by this process
	lastSend   time.Duration
	deafFrom   time.Duration // answers to it are lost in [deafFrom, deafTo)
	deafTo     time.Duration
}

// lifeMsg is a request or its answer on the way.
type lifeMsg struct {
	region  int
	nonce   string
	deliver time.Duration
	areq    Request
	req     Renewal
	base    Grant // the grant the agent presented
	// The answer, as on the wire: the grant with its identity shares as
	// changes to baseID when set, and the whole grant to compare with.
	answered   bool
	grant      Grant
	whole      Grant
	set        map[string]int64
	unset      []string
	baseID     string
	err        error
	totalAfter int64 // the policy's total the answer tells the agent
}

func runLifecycle(t *testing.T, seed uint64, f policy.Failure) {
	const regions = 3
	const total0 = 100 * policy.Micro
	const drift = 1e-4
	const span = 40 * time.Second
	ids := []string{"", "x", "y", "z"}
	r := rand.New(rand.NewPCG(seed, 7))
	timing := Timing{ValidFor: time.Second, Drift: drift, Margin: 5 * time.Millisecond, DegradedTimeout: 3 * time.Second}
	// A grant counts until it ends and its degraded budget with it: a total
	// stays the bound that long after it was lowered.
	remembered := timing.ValidFor*2 + timing.DegradedTimeout + 100*time.Millisecond

	epoch := int64(1)
	coord := clock{time.Unix(1000, 0), 1 + (r.Float64()*2-1)*drift}
	book := NewBook(total0, f, timing, epoch)
	ledger := map[string]LedgerMark{}
	write := func(d LedgerDelta) {
		for _, region := range d.Delete {
			delete(ledger, region)
		}
		for _, m := range append(d.Lower, d.Raise...) {
			ledger[m.Region] = m
		}
		book.Written(d)
	}
	total := int64(total0)
	type totalAt struct {
		at    time.Duration
		total int64
	}
	totals := []totalAt{{0, total}}
	allowed := func(now time.Duration) int64 {
		a := total
		for i, c := range totals {
			if i+1 < len(totals) && now-totals[i+1].at < remembered {
				a = max(a, c.total)
			}
		}
		return a
	}
	// The schedule's events.
	leaderChange := time.Duration(5_000+r.IntN(25_000)) * time.Millisecond
	downFor := time.Duration(r.IntN(1500)) * time.Millisecond
	limitChanges := []time.Duration{time.Duration(r.IntN(20_000)) * time.Millisecond, time.Duration(20_000+r.IntN(15_000)) * time.Millisecond}

	agents := make([]*lifeAgent, regions)
	for i := range agents {
		deaf := time.Duration(r.IntN(30_000)) * time.Millisecond
		agents[i] = &lifeAgent{h: NewHolder(timing, f, total), nonce: "n0", lastSend: -time.Hour,
			clock:    clock{time.Unix(int64(r.IntN(1e6)), 0), 1 + (r.Float64()*2-1)*drift},
			deafFrom: deaf, deafTo: deaf + time.Duration(1500+r.IntN(2000))*time.Millisecond}
	}
	var inflight []*lifeMsg
	var lastFlush time.Duration
	folded := false

	for now := time.Duration(0); now < span; now += time.Millisecond {
		cnow := coord.at(now)
		up := now < leaderChange || now >= leaderChange+downFor
		if now == leaderChange+downFor { // a new leader restores the ledger
			epoch++
			coord = clock{time.Unix(int64(5000+r.IntN(1e5)), 0), 1 + (r.Float64()*2-1)*drift}
			cnow = coord.at(now)
			book = NewBook(total, f, timing, epoch)
			t.Logf("t=%v: leader %d restores %v", now, epoch, ledger)
			for _, m := range ledger {
				book.Restore(m.Region, m.Instance, m.Nonce, m.GrantID, m.Amount, m.Total, cnow)
			}
		}
		for _, at := range limitChanges {
			if now == at {
				total = []int64{total0 / 2, total0, total0 * 3 / 2}[r.IntN(3)]
				totals = append(totals, totalAt{now, total})
				t.Logf("t=%v: total %d", now, total)
				book.SetQuota(total, f)
			}
		}
		if up && now-lastFlush >= 500*time.Millisecond {
			lastFlush = now
			write(book.Flush(cnow))
		}

		// Deliver what is due.
		keep := inflight[:0]
		for _, m := range inflight {
			a := agents[m.region]
			switch {
			case m.deliver > now:
				keep = append(keep, m)
				continue
			case m.nonce != a.nonce:
				continue // its process is gone
			case !m.answered: // a request reaching the coordinator
				if !up {
					a.h.Failed(m.areq, errors.New("no leader"))
					continue
				}
				answer(t, book, cnow, m, r, ids[1:], total, write)
				if rec := book.regions[m.req.Region]; rec != nil {
					for _, p := range rec.procs {
						for _, g := range p.out {
							folded = folded || g.ID == "folded"
						}
					}
				}
				m.answered, m.deliver = true, now+time.Duration(r.IntN(40))*time.Millisecond
				if r.IntN(10) == 0 || (now >= a.deafFrom && now < a.deafTo) {
					a.h.Failed(m.areq, errors.New("answer lost"))
					continue
				}
				keep = append(keep, m)
				continue
			}
			if m.err != nil {
				if !errors.Is(m.err, ErrStaleGrant) && !errors.Is(m.err, ErrUnknownGrant) {
					t.Fatalf("t=%v: unexpected refusal: %v", now, m.err)
				}
				a.h.Failed(m.areq, m.err)
				if a.durable.ID == m.base.ID {
					a.durable = Grant{} // never presented again
				}
				continue
			}
			g := m.grant
			if m.baseID != "" { // rebuilt from the grant the agent presented
				if m.baseID != m.base.ID {
					t.Fatalf("t=%v: changes to grant %s, the agent presented %q", now, m.baseID, m.base.ID)
				}
				g.Identities = ApplyIdentities(m.base.Identities, m.set, m.unset)
			}
			if !maps.Equal(g.Identities, m.whole.Identities) {
				t.Fatalf("t=%v: the agent rebuilt %v, the coordinator granted %v", now, g.Identities, m.whole.Identities)
			}
			if r.IntN(3) == 0 { // it reloads its policies after some grants only
				a.h.SetPolicy(f, m.totalAfter)
			}
			a.h.Granted(m.areq, g)
			if r.IntN(5) != 0 { // saved in the region's store; a failed save is not acknowledged
				a.saved, a.savedUntil = a.h.Grant()
				a.durable = a.saved
			}
		}
		inflight = keep

		for i, a := range agents {
			ac := a.clock.at(now)
			if r.IntN(12_000) == 0 { // the process restarts from its saved grant
				a.nonce = fmt.Sprint("n", now)
				t.Logf("t=%v: r%d restarts with %+v", now, i, a.saved)
				a.h, a.durable = NewHolder(timing, f, total), Grant{}
				if a.saved.ID != "" {
					a.h.Restore(a.saved, a.savedUntil)
				}
			}
			if a.h.NeedsRenewal(ac) && now-a.lastSend >= 50*time.Millisecond {
				a.lastSend = now
				areq := a.h.Sending(ac)
				var base Grant // as the agent does: the last grant saved, unless the lease asks anew
				if areq.GrantID != "" {
					base = a.durable
				}
				req := Renewal{Region: fmt.Sprint("r", i), Instance: "a", Nonce: a.nonce, Seq: areq.Seq, GrantID: base.ID, Demand: r.Int64N(total)}
				if r.IntN(10) == 0 {
					a.h.Failed(areq, errors.New("request lost"))
					continue
				}
				inflight = append(inflight, &lifeMsg{region: i, nonce: a.nonce, deliver: now + time.Duration(r.IntN(40))*time.Millisecond, areq: areq, req: req, base: base})
			}
		}

		// The invariants.
		if !up {
			continue // no book to ask; the new one checks what is still enforced
		}
		limit := allowed(now)
		for _, id := range ids {
			var enforced int64
			for i, a := range agents {
				amount, mode := a.h.Enforce(id, a.clock.at(now))
				if mode == ModeDegraded && !Reserved(f) {
					continue // fail-open: overshoot by design, counted by bound
				}
				enforced += amount
				if booked := book.Enforcing(fmt.Sprint("r", i), id, cnow); amount > booked {
					t.Fatalf("t=%v: region %d enforces %d (%s) for identity %q, the coordinator (epoch %d) books %d", now, i, amount, mode, id, epoch, booked)
				}
			}
			if enforced > limit {
				t.Fatalf("t=%v: regions enforce %d > %d for identity %q", now, enforced, limit, id)
			}
			// A restored region is booked at its ledger mark, its largest
			// share of any identity, for every identity: the book may then
			// hold more than the total (docs/identity-shares.md), never less
			// than what is enforced.
			if s := book.Sum(id, cnow); s > limit && now >= leaderChange+downFor+remembered {
				t.Fatalf("t=%v: regions may be enforcing %d > %d for identity %q", now, s, limit, id)
			}
		}
	}
	if !folded {
		t.Log("no grants folded in this schedule")
	}
}

// answer is the coordinator answering m at now with random targets, as
// it writes the ledger and then commits; the grant goes back as changes
// to the acknowledged grant when the book knows it.
func answer(t *testing.T, book *Book, now time.Time, m *lifeMsg, r *rand.Rand, ids []string, total int64, write func(LedgerDelta)) {
	targets := Targets{Default: max(Floor(book.failure, total), r.Int64N(total+1))}
	for _, id := range ids {
		if r.IntN(5) < 3 {
			if targets.Identities == nil {
				targets.Identities = map[string]int64{}
			}
			targets.Identities[id] = r.Int64N(total + 1)
		}
	}
	p, err := book.PrepareTargets(now, m.req, targets)
	if err != nil {
		m.err = err
		return
	}
	write(p.Ledger())
	book.Commit(p)
	m.whole, m.grant, m.totalAfter = p.Grant(), p.Grant(), total
	if base, ok := p.Base(); ok {
		if base.ID != m.req.GrantID {
			t.Fatalf("the changes are based on %s, the agent presented %q", base.ID, m.req.GrantID)
		}
		m.baseID = base.ID
		m.set, m.unset = DiffIdentities(base.Identities, m.whole.Identities)
		m.grant.Identities = nil
	}
}
