package lease

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// clock maps true (virtual) time to a node's clock: its own origin and a
// rate off by at most the drift bound.
type clock struct {
	origin time.Time
	rate   float64
}

func (c clock) at(t time.Duration) time.Time {
	return c.origin.Add(time.Duration(float64(t) * c.rate))
}

type message struct {
	region  int
	deliver time.Duration // true time of arrival
	areq    Request       // as the agent sent it
	req     Renewal
	grant   *Grant
	err     error
}

// scheduleModes are the failure modes the random schedules take turns in.
var scheduleModes = []policy.Failure{
	{Mode: policy.FailClosed},
	{Mode: policy.StaticShare, StaticFraction: 0.2},
	{Mode: policy.LastLease, StaticFraction: 0.1, Decay: policy.Duration(2 * time.Second)},
	{Mode: policy.FailOpen, OpenFraction: 0.3},
}

// TestLeaseSafetyRandomSchedules is the lease protocol's property test: on
// random schedules with drifting clocks, delays, lost messages and
// partitions, (1) the sum of what regions may be enforcing, as the
// coordinator books it, never exceeds the total, and (2) no agent ever
// enforces more than the coordinator books for it: an agent never believes
// a lease valid after the coordinator considers it expired.
func TestLeaseSafetyRandomSchedules(t *testing.T) {
	for seed := uint64(1); seed <= 24; seed++ {
		f := scheduleModes[seed%uint64(len(scheduleModes))]
		t.Run(fmt.Sprintf("seed%d/%s", seed, f.Mode), func(t *testing.T) {
			runSchedule(t, seed, f, nil)
		})
	}
}

// The same property per identity, with identities that get shares of their
// own, change them and go back to the default at random: for every
// identity, what the regions may be enforcing never sums to more than the
// total, and no agent enforces more for an identity than the coordinator
// books for it.
func TestIdentitySharesSafetyRandomSchedules(t *testing.T) {
	for seed := uint64(1); seed <= 24; seed++ {
		f := scheduleModes[seed%uint64(len(scheduleModes))]
		t.Run(fmt.Sprintf("seed%d/%s", seed, f.Mode), func(t *testing.T) {
			runSchedule(t, seed, f, []string{"x", "y", "z"})
		})
	}
}

func runSchedule(t *testing.T, seed uint64, f policy.Failure, ids []string) {
	const regions = 3
	const total = 100 * policy.Micro
	const drift = 1e-4
	r := rand.New(rand.NewPCG(seed, 99))
	timing := Timing{ValidFor: time.Second, Drift: drift, Margin: 5 * time.Millisecond, DegradedTimeout: 3 * time.Second}
	coordClock := clock{time.Unix(1000, 0), 1 + (r.Float64()*2-1)*drift}
	book := NewBook(total, f, timing, 7)
	floor := Floor(f, total)

	agents := make([]*Holder, regions)
	clocks := make([]clock, regions)
	type partition struct{ from, to time.Duration }
	parts := make([]partition, regions)
	for i := range agents {
		agents[i] = NewHolder(timing, f, total)
		clocks[i] = clock{time.Unix(int64(r.IntN(1e6)), 0), 1 + (r.Float64()*2-1)*drift}
		from := time.Duration(r.IntN(20_000)) * time.Millisecond
		parts[i] = partition{from, from + time.Duration(r.IntN(8000))*time.Millisecond}
	}
	cut := func(i int, at time.Duration) bool { return at >= parts[i].from && at < parts[i].to }
	var inflight []message
	lastSend := make([]time.Duration, regions)
	for i := range lastSend {
		lastSend[i] = -time.Hour
	}

	for now := time.Duration(0); now < 30*time.Second; now += time.Millisecond {
		// Deliver what is due.
		keep := inflight[:0]
		for _, m := range inflight {
			if m.deliver > now {
				keep = append(keep, m)
				continue
			}
			a := agents[m.region]
			if m.grant == nil && m.err == nil { // a request reaching the coordinator
				targets := Targets{Default: max(floor, r.Int64N(total+1))}
				for _, id := range ids { // each identity its own share here, or the default
					if r.IntN(5) < 3 {
						if targets.Identities == nil {
							targets.Identities = map[string]int64{}
						}
						targets.Identities[id] = r.Int64N(total + 1)
					}
				}
				p, err := book.PrepareTargets(coordClock.at(now), m.req, targets)
				if err == nil {
					book.Commit(p)
					g := p.Grant()
					m.grant = &g
				} else {
					m.err = err
				}
				m.deliver = now + time.Duration(r.IntN(40))*time.Millisecond
				if r.IntN(10) == 0 || cut(m.region, now) {
					a.Failed(m.areq, errors.New("lost")) // the response is lost
					continue
				}
				keep = append(keep, m)
				continue
			}
			if m.err != nil {
				if !errors.Is(m.err, ErrStaleGrant) {
					t.Fatalf("unexpected refusal: %v", m.err)
				}
				a.Failed(m.areq, m.err)
				continue
			}
			a.Granted(m.areq, *m.grant)
		}
		inflight = keep

		// Agents renew when due (retrying at most every 50 ms).
		for i, a := range agents {
			ac := clocks[i].at(now)
			if a.NeedsRenewal(ac) && now-lastSend[i] >= 50*time.Millisecond {
				lastSend[i] = now
				areq := a.Sending(ac)
				req := Renewal{Region: fmt.Sprint("r", i), Instance: "a", Nonce: "n", Seq: areq.Seq, GrantID: areq.GrantID, Demand: r.Int64N(total)}
				if r.IntN(10) == 0 || cut(i, now) {
					a.Failed(areq, errors.New("lost")) // the request is lost
					continue
				}
				inflight = append(inflight, message{region: i, deliver: now + time.Duration(r.IntN(40))*time.Millisecond, areq: areq, req: req})
			}
		}

		// The invariants.
		cnow := coordClock.at(now)
		for _, id := range append([]string{""}, ids...) {
			if s := book.Sum(id, cnow); s > total {
				t.Fatalf("t=%v: regions may be enforcing %d > total %d for identity %q", now, s, total, id)
			}
			for i, a := range agents {
				amount, mode := a.Enforce(id, clocks[i].at(now))
				if mode == ModeDegraded && !Reserved(f) {
					continue // fail-open: overshoot by design, counted by bound
				}
				if booked := book.Enforcing(fmt.Sprint("r", i), id, cnow); amount > booked {
					t.Fatalf("t=%v: region %d enforces %d (%s) for identity %q but the coordinator books only %d", now, i, amount, mode, id, booked)
				}
			}
		}
	}
}

func TestBookShrinkIsTwoPhase(t *testing.T) {
	timing := Timing{ValidFor: time.Second, DegradedTimeout: time.Minute}
	b := NewBook(100, policy.Failure{Mode: policy.FailClosed}, timing, 1)
	t0 := time.Unix(0, 0)
	seq := uint64(0)
	grant := func(at time.Duration, region, id string, target int64) Grant {
		t.Helper()
		seq++
		p, err := b.Prepare(t0.Add(at), Renewal{Region: region, Instance: region, Nonce: "n", Seq: seq, GrantID: id}, target)
		if err != nil {
			t.Fatal(err)
		}
		b.Commit(p)
		return p.Grant()
	}
	us := grant(0, "us", "", 80)
	eu := grant(0, "eu", "", 80)
	if us.Amount != 80 || eu.Amount != 20 {
		t.Fatalf("us %d eu %d, want 80 and the 20 left", us.Amount, eu.Amount)
	}
	// us shrinks to 30: eu may not take the freed 50 until us acknowledges.
	us2 := grant(100*time.Millisecond, "us", us.ID, 30)
	if got := grant(200*time.Millisecond, "eu", eu.ID, 70); got.Amount != 20 {
		t.Fatalf("eu got %d before us acknowledged its shrink, want 20", got.Amount)
	}
	if st := b.Statuses(t0.Add(200 * time.Millisecond)); st[1].State != Shrinking || st[1].Enforcing != 80 {
		t.Fatalf("us status %+v, want shrinking, enforcing 80", st[1])
	}
	grant(300*time.Millisecond, "us", us2.ID, 30) // the acknowledgement
	if got := grant(400*time.Millisecond, "eu", eu.ID, 70); got.Amount != 70 {
		t.Fatalf("eu got %d after the acknowledgement, want 70", got.Amount)
	}
}

func TestBookShrinkFreesAtExpiryWithoutAck(t *testing.T) {
	timing := Timing{ValidFor: time.Second}
	b := NewBook(100, policy.Failure{Mode: policy.FailClosed}, timing, 1)
	t0 := time.Unix(0, 0)
	p, _ := b.Prepare(t0, Renewal{Region: "us"}, 100)
	b.Commit(p)
	p, _ = b.Prepare(t0.Add(500*time.Millisecond), Renewal{Region: "us", Seq: 1, GrantID: p.Grant().ID}, 10)
	b.Commit(p)
	if a := b.Available("eu", "", t0.Add(999*time.Millisecond)); a != 0 {
		t.Fatalf("available %d while the old 100 may be enforced", a)
	}
	if a := b.Available("eu", "", t0.Add(time.Second)); a != 90 {
		t.Fatalf("available %d after the old grant expired, want 90", a)
	}
}

func TestBookDegradedReservation(t *testing.T) {
	timing := Timing{ValidFor: time.Second, DegradedTimeout: 10 * time.Second}
	f := policy.Failure{Mode: policy.StaticShare, StaticFraction: 0.25}
	b := NewBook(100, f, timing, 1)
	t0 := time.Unix(0, 0)
	p, _ := b.Prepare(t0, Renewal{Region: "ap"}, 60)
	b.Commit(p)
	// ap stops renewing. After expiry its static share (25) stays reserved.
	at := t0.Add(2 * time.Second)
	if got := b.Enforcing("ap", "", at); got != 25 {
		t.Fatalf("reserved %d, want 25", got)
	}
	if st := b.Statuses(at)[0]; st.State != Degraded || st.Reserved != 25 {
		t.Fatalf("status %+v, want degraded with 25 reserved", st)
	}
	if err := b.Release("ap", t0.Add(500*time.Millisecond)); !errors.Is(err, ErrStillLeased) {
		t.Fatalf("release of a live lease: %v", err)
	}
	// The timeout passes: nothing reserved any more.
	if got := b.Enforcing("ap", "", t0.Add(11*time.Second+time.Millisecond)); got != 0 {
		t.Fatalf("reserved %d after the timeout", got)
	}
	// Or an SRE releases it earlier.
	if err := b.Release("ap", at); err != nil || b.Enforcing("ap", "", at) != 0 {
		t.Fatalf("release: %v, enforcing %d", err, b.Enforcing("ap", "", at))
	}
}

func TestBookRefusals(t *testing.T) {
	b := NewBook(100, policy.Failure{Mode: policy.FailClosed}, Timing{ValidFor: time.Second}, 3)
	t0 := time.Unix(0, 0)
	p, _ := b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n1", Seq: 1}, 10)
	b.Commit(p)
	g1 := p.Grant()
	p, _ = b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n1", Seq: 2, GrantID: g1.ID}, 20)
	b.Commit(p)
	p, _ = b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n1", Seq: 3, GrantID: p.Grant().ID}, 30)
	b.Commit(p)
	sum := b.MostBooked(t0)
	cases := []struct {
		r    Renewal
		want error
	}{
		{Renewal{Region: "us", Instance: "a", Nonce: "n1", GrantID: "9.9"}, ErrUnknownGrant},
		{Renewal{Region: "us", Instance: "a", Nonce: "n1", GrantID: "garbage"}, ErrUnknownGrant},
		{Renewal{Region: "us", Instance: "a", Nonce: "n1", GrantID: g1.ID}, ErrStaleGrant},
		{Renewal{Region: "us", Instance: "a", Nonce: "n1", GrantID: "2.1"}, ErrStaleGrant},
	}
	for _, c := range cases {
		if _, err := b.Prepare(t0, c.r, 50); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.r, err, c.want)
		}
	}
	// A restart (new nonce) is accepted; the old process coming back is not.
	p, err := b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n2"}, 30)
	if err != nil {
		t.Fatal(err)
	}
	b.Commit(p)
	if _, err := b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n1"}, 30); !errors.Is(err, ErrDuplicateInstance) {
		t.Fatalf("old process renewing: %v, want duplicate instance", err)
	}
	if b.MostBooked(t0) != sum {
		t.Fatalf("refusals changed the book: %d -> %d", sum, b.MostBooked(t0))
	}
}

func TestBookRestoreHonoursFullLease(t *testing.T) {
	b := NewBook(100, policy.Failure{Mode: policy.FailClosed}, Timing{ValidFor: time.Second}, 9)
	t0 := time.Unix(50, 0)
	b.Restore("us", "a", "n", "8.4", 70, 0, t0)
	if a := b.Available("eu", "", t0.Add(999*time.Millisecond)); a != 30 {
		t.Fatalf("available %d under a restored grant, want 30", a)
	}
	p, err := b.Prepare(t0, Renewal{Region: "us", Instance: "a", Nonce: "n", Seq: 1, GrantID: "8.4"}, 70)
	if err != nil || p.Grant().Epoch != 9 {
		t.Fatalf("renewal of an old epoch's grant: %+v %v", p, err)
	}
}

func TestHolderTimeline(t *testing.T) {
	timing := Timing{ValidFor: 10 * time.Second, Drift: 1e-4, Margin: 100 * time.Millisecond, DegradedTimeout: time.Minute}
	f := policy.Failure{Mode: policy.LastLease, StaticFraction: 0.1, Decay: policy.Duration(10 * time.Second)}
	a := NewHolder(timing, f, 1000)
	t0 := time.Unix(0, 0)
	if amt, m := a.Enforce("", t0); m != ModeNone || amt != 0 {
		t.Fatalf("before any grant: %d %s", amt, m)
	}
	a.Granted(a.Sending(t0), Grant{ID: "1.1", Amount: 600, ValidFor: 10 * time.Second})
	want := 10*time.Second - 2*time.Millisecond - 100*time.Millisecond // 2ρV = 2 ms
	if _, until := a.Grant(); until.Sub(t0) != want {
		t.Fatalf("valid for %v from send, want %v", until.Sub(t0), want)
	}
	if amt, m := a.Enforce("", t0.Add(want-1)); m != ModeLeased || amt != 600 {
		t.Fatalf("just before expiry: %d %s", amt, m)
	}
	// Exactly when the lease may have expired, degraded takes over: last
	// lease decaying to 10%.
	if amt, m := a.Enforce("", t0.Add(want)); m != ModeDegraded || amt != 600 {
		t.Fatalf("at expiry: %d %s, want degraded at the last share", amt, m)
	}
	if amt, _ := a.Enforce("", t0.Add(want+5*time.Second)); amt < 340 || amt > 350 {
		t.Fatalf("half-way through the decay: %d, want about 350", amt)
	}
	if amt, _ := a.Enforce("", t0.Add(want+20*time.Second)); amt != 100 {
		t.Fatalf("after the decay: %d, want the static 100", amt)
	}
	if amt, m := a.Enforce("", t0.Add(want+2*time.Minute)); amt != 0 || a.State(t0.Add(want+2*time.Minute)) != Expired {
		t.Fatalf("after the degraded timeout: %d %s", amt, m)
	}
	// A late answer to an older request does not replace a newer grant.
	older, newer := a.Sending(t0.Add(2*time.Minute)), a.Sending(t0.Add(3*time.Minute))
	a.Granted(newer, Grant{ID: "1.3", Amount: 500, ValidFor: 10 * time.Second})
	a.Granted(older, Grant{ID: "1.2", Amount: 900, ValidFor: 10 * time.Second})
	if g, _ := a.Grant(); g.ID != "1.3" {
		t.Fatalf("stale answer installed: %+v", g)
	}
}

func TestTimingValidate(t *testing.T) {
	bad := []Timing{
		{ValidFor: 0},
		{ValidFor: time.Second, Drift: -1},
		{ValidFor: time.Second, Drift: 0.5},
		{ValidFor: time.Second, Margin: 2 * time.Second},
	}
	for _, tm := range bad {
		if tm.Validate() == nil {
			t.Errorf("%+v accepted", tm)
		}
	}
	if err := DefaultTiming.Validate(); err != nil {
		t.Fatal(err)
	}
}

// An agent configured for 10 s leases that is granted 2 s ones renews on
// the grant's schedule, well before it lapses.
func TestHolderRenewsOnTheGrantsDuration(t *testing.T) {
	a := NewHolder(DefaultTiming, policy.Failure{Mode: policy.FailClosed}, 100)
	t0 := time.Unix(0, 0)
	a.Granted(a.Sending(t0), Grant{ID: "1.1", Amount: 50, ValidFor: 2 * time.Second})
	_, until := a.Grant()
	if until.Sub(t0) >= 2*time.Second {
		t.Fatalf("valid for %v, longer than the 2 s grant", until.Sub(t0))
	}
	if !a.NeedsRenewal(t0.Add(time.Second)) {
		t.Fatal("no renewal due 1 s into a 2 s lease")
	}
	if a.NeedsRenewal(t0.Add(500 * time.Millisecond)) {
		t.Fatal("renewal due after only 500 ms of a 2 s lease")
	}
}

// A limit lowered while a region is cut off: its agent falls back from its
// last grant with the policy it has, the old one. The book reserves the
// degraded budget from the total the grant was issued under, and an agent
// given a grant under the lower total before it reloads its policies
// falls back from that one.
func TestLoweredLimitWhileCutOff(t *testing.T) {
	timing := Timing{ValidFor: time.Second, DegradedTimeout: time.Minute}
	f := policy.Failure{Mode: policy.StaticShare, StaticFraction: 0.2}
	b := NewBook(150, f, timing, 1)
	t0 := time.Unix(0, 0)
	p, err := b.PrepareTargets(t0, Renewal{Region: "us", Instance: "a", Nonce: "n", Seq: 1}, Targets{Default: 100})
	if err != nil {
		t.Fatal(err)
	}
	b.Commit(p)
	agent := NewHolder(timing, f, 150)
	req := agent.Sending(t0)
	agent.Granted(req, p.Grant())
	b.SetQuota(50, f) // the agent is cut off and never hears of it
	later := t0.Add(2 * time.Second)
	enforced, mode := agent.Enforce("", later)
	if mode != ModeDegraded || enforced != 30 {
		t.Fatalf("the agent enforces %d (%s), want its static share of the old limit, 30 (degraded)", enforced, mode)
	}
	if booked := b.Enforcing("us", "", later); booked < enforced {
		t.Fatalf("the book reserves %d for us, which enforces %d", booked, enforced)
	}

	// A grant under the lowered total, to an agent that still has the old
	// policy: it falls back from the lower total.
	p, err = b.PrepareTargets(later, Renewal{Region: "eu", Instance: "b", Nonce: "m", Seq: 1}, Targets{Default: 20})
	if err != nil {
		t.Fatal(err)
	}
	b.Commit(p)
	eu := NewHolder(timing, f, 150)
	eu.Granted(eu.Sending(later), p.Grant())
	end := later.Add(2 * time.Second)
	if got, _ := eu.Enforce("", end); got > b.Enforcing("eu", "", end) || got != 10 {
		t.Fatalf("eu enforces %d, the book reserves %d; want 10 (a fifth of the lowered limit)", got, b.Enforcing("eu", "", end))
	}
}
