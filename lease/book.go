package lease

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/policy"
)

// Errors a renewal can be refused with.
var (
	// ErrUnknownGrant: the presented grant id was never issued.
	ErrUnknownGrant = errors.New("grant was never issued by this coordinator; ask for a new lease without a grant id")
	// ErrStaleGrant: the presented grant id was superseded, by a newer
	// grant the agent acknowledged or by a newer leader; ask anew.
	ErrStaleGrant = errors.New("grant is stale: a newer grant superseded it; ask for a new lease without a grant id")
	// ErrDuplicateInstance: two live processes claim one instance id.
	ErrDuplicateInstance = errors.New("instance id is used by two agent processes")
	// ErrStillLeased: a region holding a valid lease cannot be released.
	ErrStillLeased = errors.New("region still holds a valid lease")
)

// maxOutstanding bounds the grants remembered per agent process; older
// ones are folded into one conservative entry.
const maxOutstanding = 16

// issued is a grant handed to one agent process and not yet retired: the
// process may enforce it until it expires, and (for the degraded budget)
// may remember it as its last share until it acknowledges a newer one.
type issued struct {
	Grant
	At  time.Time // coordinator clock at grant
	Seq uint64    // the agent's request sequence number it answered
	// restored says the grant came from the ledger (Book.Restore), which
	// does not keep identity shares: no delta may be based on it.
	restored bool
}

func (g issued) end() time.Time { return g.At.Add(g.ValidFor) }

// process is what one agent process (one nonce) of a region may enforce.
type process struct {
	nonce string
	out   []issued // outstanding grants, oldest first
}

// Record is what a Book knows of one region's lease on its quota.
type Record struct {
	Region   string
	Instance string
	Nonce    string // the newest process's nonce
	// Demand is the region's last reported demand (amount units).
	Demand int64
	// Persisted is the amount the durable ledger records for the region:
	// a high-water mark a new leader must assume may be enforced.
	Persisted int64

	procs    []*process        // newest last
	latest   map[string]string // instance -> its newest nonce
	replaced []string          // nonces replaced by a restart of their instance
}

// current is the newest grant of the newest process (zero if none).
func (r *Record) current() issued {
	if len(r.procs) == 0 {
		return issued{}
	}
	p := r.procs[len(r.procs)-1]
	if len(p.out) == 0 {
		return issued{}
	}
	return p.out[len(p.out)-1]
}

func (r *Record) clone() *Record {
	c := *r
	c.procs = make([]*process, len(r.procs))
	for i, p := range r.procs {
		c.procs[i] = &process{nonce: p.nonce, out: append([]issued(nil), p.out...)}
	}
	c.latest = make(map[string]string, len(r.latest))
	for k, v := range r.latest {
		c.latest[k] = v
	}
	c.replaced = append([]string(nil), r.replaced...)
	return &c
}

// Book is the coordinator's view of one quota: for every region, what it
// may currently be enforcing. Its one promise (lease safety, docs/design.md): the
// sum over regions of that amount never exceeds the quota's total, except
// by fail-open budgets, which bound counts. It is not safe for concurrent
// use; the coordinator guards each Book with a mutex.
type Book struct {
	total   int64
	failure policy.Failure
	timing  Timing
	epoch   int64
	seq     int64
	regions map[string]*Record
}

// NewBook returns an empty book for a quota of total amount under failure
// policy f, issuing grants of epoch.
func NewBook(total int64, f policy.Failure, t Timing, epoch int64) *Book {
	return &Book{total: total, failure: f, timing: t, epoch: epoch, regions: map[string]*Record{}}
}

// Total is the quota's total amount.
func (b *Book) Total() int64 { return b.total }

// SetQuota changes the total and failure policy (a policy update). Grants
// already out keep counting at their amounts until they end.
func (b *Book) SetQuota(total int64, f policy.Failure) { b.total, b.failure = total, f }

// Enforcing returns what region may be enforcing at now for identity
// ("" for one no grant names): over its agent processes and their
// outstanding grants, the share each gives it, or for a process whose
// grants all expired, its reserved degraded budget.
func (b *Book) Enforcing(region, identity string, now time.Time) int64 {
	r := b.regions[region]
	if r == nil {
		return 0
	}
	return b.enforcingFor(r, identity, now)
}

// enforcing is the most r may be enforcing at now for any identity (the
// region's high-water mark for the ledger).
func (b *Book) enforcing(r *Record, now time.Time) int64 {
	var e int64
	for _, p := range r.procs {
		for _, g := range p.out {
			e = max(e, b.contribution(g, g.largest(), now))
		}
	}
	return e
}

// enforcingFor is the most r may be enforcing at now for identity ("" for
// an identity no grant names): over its processes and their outstanding
// grants, the share each gives it.
func (b *Book) enforcingFor(r *Record, identity string, now time.Time) int64 {
	var e int64
	for _, p := range r.procs {
		for _, g := range p.out {
			e = max(e, b.contribution(g, g.AmountFor(identity), now))
		}
	}
	return e
}

// contribution is what an outstanding grant giving amount may have the
// agent enforce at now: the amount while valid; after that the degraded
// budget decaying from it, until the degraded timeout, because an agent
// whose newest installed grant is this one falls back from it. It never
// increases over time, so only new grants, which Prepare caps, can raise a
// sum.
func (b *Book) contribution(g issued, amount int64, now time.Time) int64 {
	if now.Before(g.end()) {
		return amount
	}
	since := now.Sub(g.end())
	if !Reserved(b.failure) || since >= b.timing.DegradedTimeout {
		return 0
	}
	// The larger of the grant's total and the book's: an agent falls back
	// from the lower of the grant's and its policy's (an agent before
	// Grant.Total from its policy's alone, which may be the current one),
	// and may not know yet of a limit lowered since the grant was issued.
	return DegradedBudget(b.failure, max(b.total, g.Total), amount, since)
}

// lapsed reports whether process p's grants have all expired, and since.
func lapsed(p *process, now time.Time) (bool, time.Duration) {
	var end time.Time
	for _, g := range p.out {
		if g.end().After(end) {
			end = g.end()
		}
	}
	if len(p.out) == 0 || now.Before(end) {
		return false, 0
	}
	return true, now.Sub(end)
}

// Idle reports whether no region may be enforcing anything at now: every
// grant and degraded budget ran out.
func (b *Book) Idle(now time.Time) bool {
	for _, r := range b.regions {
		if b.enforcing(r, now) > 0 {
			return false
		}
	}
	return true
}

// Sum returns the total over all regions of what they may be enforcing
// at now for identity ("" for one no grant names): the book's promise is
// that it never exceeds the total, for every identity.
func (b *Book) Sum(identity string, now time.Time) int64 {
	var s int64
	for _, r := range b.regions {
		s += b.enforcingFor(r, identity, now)
	}
	return s
}

// MostBooked returns the largest Sum over the identities (those with
// shares of their own, and the rest): how full the quota is booked.
func (b *Book) MostBooked(now time.Time) int64 {
	m := b.Sum("", now)
	for id := range b.owners() {
		m = max(m, b.Sum(id, now))
	}
	return m
}

// Available returns how much region could be granted for identity ("" for
// its default share) at now without that identity's sum exceeding the
// total: the total less what the other regions may be enforcing for it.
func (b *Book) Available(region, identity string, now time.Time) int64 {
	var other int64
	for name, r := range b.regions {
		if name != region {
			other += b.enforcingFor(r, identity, now)
		}
	}
	return max(0, b.total-other)
}

// Renewal is one agent process's request for its region's lease on this
// quota.
type Renewal struct {
	Region, Instance string
	// Nonce identifies the agent process (random per start).
	Nonce string
	// Seq numbers the process's requests for this quota, increasing. The
	// agent installs an answer only if it answers a newer request than the
	// grant it holds.
	Seq uint64
	// GrantID is the grant the agent enforces ("" for none). Presenting it
	// retires every grant that answered an older request of the process:
	// the agent will never install those.
	GrantID string
	// Demand is the region's demand in amount units.
	Demand int64
	// Identities are the instance's changed demands (amount units) of the
	// identities that may need shares of their own (DemandReport.Changes),
	// and IdentitiesHeld how many it believes the coordinator holds, for
	// the coordinator's IdentityPlan.Update; the book does not read them.
	Identities     map[string]int64
	IdentitiesHeld int
}

// Pending is a grant prepared by Prepare and not yet committed. The
// coordinator writes its Ledger delta, when not empty, then Commits.
type Pending struct {
	rec    *Record
	grant  Grant
	base   Grant
	isNew  bool
	ledger LedgerDelta
}

// Grant is the grant the pending renewal hands out.
func (p *Pending) Grant() Grant { return p.grant }

// Base is the grant the renewal acknowledged, when the book knows its
// identity shares: the agent holds it, so the new grant's identity shares
// can be sent as changes to it (DiffIdentities).
func (p *Pending) Base() (Grant, bool) { return p.base, p.base.ID != "" }

// Targets are what a renewal's grant aims at: the region's default share,
// and the shares of the identities that hold their own (the identity
// planning round's, PlanIdentities).
type Targets struct {
	Default int64
	// Identities gives an identity's own share in the region. An identity
	// that holds one anywhere and is not named here goes back to the
	// default in this region once that is safe.
	Identities map[string]int64
}

// Prepare computes the grant for r at now, aiming at target for the default
// share, every identity's own share unchanged (PrepareTargets).
func (b *Book) Prepare(now time.Time, r Renewal, target int64) (*Pending, error) {
	var own map[string]int64
	if rec := b.regions[r.Region]; rec != nil {
		own = rec.current().Identities
	}
	return b.PrepareTargets(now, r, Targets{Default: target, Identities: own})
}

// PrepareTargets computes the grant for r at now, aiming at t: each share
// the target, capped at what the other regions leave free for the
// identities it covers. It changes nothing; Commit applies it. Shrinking is
// two-phase by construction: the older, larger grants keep counting until
// the agent acknowledges a newer one or they expire, so a shrink frees
// nothing for others before then.
func (b *Book) PrepareTargets(now time.Time, r Renewal, t Targets) (*Pending, error) {
	rec := &Record{Region: r.Region}
	if old := b.regions[r.Region]; old != nil {
		rec = old.clone()
	}
	p, err := b.process(rec, r)
	if err != nil {
		return nil, err
	}
	var base Grant
	if r.GrantID != "" {
		i := indexOf(p.out, r.GrantID)
		if i < 0 {
			return nil, b.grantError(r.GrantID)
		}
		if !p.out[i].restored {
			base = p.out[i].Grant
		}
		acked := p.out[i].Seq
		keep := p.out[:0]
		for _, g := range p.out {
			if g.Seq >= acked {
				keep = append(keep, g)
			}
		}
		p.out = keep
	}
	rec.Demand = r.Demand

	cur := rec.current()
	amount, own, changed := b.shares(r.Region, cur.Grant, t, now)
	g := Grant{
		ID:         fmt.Sprintf("%d.%d", b.epoch, b.seq+1),
		Amount:     amount,
		Identities: own,
		Epoch:      b.epoch,
		ValidFor:   b.timing.ValidFor,
		Total:      b.total,
	}
	if b.shrinks(rec, g, now) {
		// Another region may be waiting for what this grant gives back: the
		// agent acknowledges it soon instead of at a third of its validity.
		g.RenewAfter = b.timing.ValidFor / shrinkRenewals
	}
	isNew := true
	if cur.ID != "" && cur.ID == r.GrantID && cur.Amount == amount && !changed &&
		cur.Total == b.total && cur.Epoch == b.epoch && now.Before(cur.end()) {
		g.ID, isNew = cur.ID, false // an unchanged share keeps its id
		p.out = p.out[:len(p.out)-1]
	}
	p.out = append(p.out, issued{Grant: g, At: now, Seq: r.Seq})
	if len(p.out) > maxOutstanding {
		p.out = fold(p.out)
	}
	pe := &Pending{rec: rec, grant: g, base: base, isNew: isNew}
	if e := b.enforcing(rec, now); e > rec.Persisted {
		rec.Persisted = e
		pe.ledger = LedgerDelta{
			Raise: []LedgerMark{{
				Region:   r.Region,
				Instance: r.Instance,
				Nonce:    r.Nonce,
				GrantID:  g.ID,
				Amount:   e,
				Total:    grantsTotal(rec),
			}},
			Lower: b.lowered(now, r.Region),
		}
	}
	return pe, nil
}

// shrinkRenewals is how much sooner than its validity an agent renews to
// acknowledge a grant that gives something back (Book.shrinks).
const shrinkRenewals = 20

// shrinks reports whether g gives any identity (or the default) less than
// rec may be enforcing for it at now: a shrink, which frees nothing for
// other regions until the agent acknowledges g.
func (b *Book) shrinks(rec *Record, g Grant, now time.Time) bool {
	if g.Amount < b.enforcingFor(rec, "", now) {
		return true
	}
	for id, a := range g.Identities {
		if a < b.enforcingFor(rec, id, now) {
			return true
		}
	}
	return false
}

// shares computes region's default share and its identities' own ones at
// now, aiming at t, as changes to cur (the region's current grant). The
// default is capped at what the other regions leave free for the
// identities no grant names; an identity's own share at what they leave
// free for it. An identity held somewhere but not in t goes back to the
// default here only when the default fits what is free for it; until then
// it keeps a share of its own, at most the default. The identity shares
// are cur's own map when nothing changed, else a new one: grants share
// unchanged maps, so memory follows what changes.
func (b *Book) shares(
	region string,
	cur Grant,
	t Targets,
	now time.Time,
) (amount int64, own map[string]int64, changed bool) {
	amount = min(max(t.Default, 0), b.Available(region, "", now))
	var set map[string]int64 // what differs from cur
	kept := 0                // cur's entries given unchanged
	give := func(id string, a int64) {
		if old, ok := cur.Identities[id]; ok && old == a {
			kept++
			return
		}
		if set == nil {
			set = map[string]int64{}
		}
		set[id] = a
	}
	for id, want := range t.Identities {
		give(id, min(max(want, 0), b.Available(region, id, now)))
	}
	var held map[string]bool // held somewhere, not in t, and still needing a share here
	for _, r := range b.regions {
		for _, p := range r.procs {
			for _, g := range p.out {
				for id := range g.Identities {
					if _, ok := t.Identities[id]; ok || held[id] {
						continue
					}
					if free := b.Available(region, id, now); free < amount {
						if held == nil {
							held = map[string]bool{}
						}
						held[id] = true
						give(id, free)
					}
				}
			}
		}
	}
	if len(set) == 0 && kept == len(cur.Identities) {
		return amount, cur.Identities, false
	}
	var unset []string
	for id := range cur.Identities {
		if _, ok := t.Identities[id]; !ok && !held[id] {
			unset = append(unset, id) // back to the default
		}
	}
	return amount, ApplyIdentities(cur.Identities, set, unset), true
}

// owners returns the identities with shares of their own in any region's
// outstanding grants.
func (b *Book) owners() map[string]bool {
	var ids map[string]bool
	for _, r := range b.regions {
		for _, p := range r.procs {
			for _, g := range p.out {
				for id := range g.Identities {
					if ids == nil {
						ids = map[string]bool{}
					}
					ids[id] = true
				}
			}
		}
	}
	return ids
}

// process returns rec's process for r's nonce, creating it for a new or
// restarted agent. A nonce that a restart of the same instance replaced,
// coming back, means two live processes share one instance id.
func (b *Book) process(rec *Record, r Renewal) (*process, error) {
	for _, n := range rec.replaced {
		if n == r.Nonce {
			return nil, fmt.Errorf("%w: %q in region %q", ErrDuplicateInstance, r.Instance, r.Region)
		}
	}
	if rec.latest == nil {
		rec.latest = map[string]string{}
	}
	if prev := rec.latest[r.Instance]; prev != "" && prev != r.Nonce {
		rec.replaced = append(rec.replaced, prev)
		if len(rec.replaced) > 8 {
			rec.replaced = rec.replaced[1:]
		}
	}
	rec.latest[r.Instance] = r.Nonce
	rec.Instance, rec.Nonce = r.Instance, r.Nonce
	for _, p := range rec.procs {
		if p.nonce == r.Nonce {
			return p, nil
		}
	}
	p := &process{nonce: r.Nonce}
	rec.procs = append(rec.procs, p)
	return p, nil
}

func indexOf(out []issued, id string) int {
	for i, g := range out {
		if g.ID == id {
			return i
		}
	}
	return -1
}

// fold merges the oldest outstanding grants into one entry with the
// largest amount and the latest end, so memory stays bounded and nothing
// is counted for less or for shorter.
func fold(out []issued) []issued {
	n := len(out) - maxOutstanding + 2
	f := out[0]
	end := f.end()
	var ids map[string]int64
	for _, g := range out[:n] {
		for id := range g.Identities {
			if ids == nil {
				ids = map[string]int64{}
			}
			ids[id] = 0
		}
	}
	for id := range ids { // each identity at the most any folded grant gave it
		for _, g := range out[:n] {
			ids[id] = max(ids[id], g.AmountFor(id))
		}
	}
	for _, g := range out[1:n] {
		f.Amount = max(f.Amount, g.Amount)
		f.Total = max(f.Total, g.Total)
		f.Seq = max(f.Seq, g.Seq)
		if g.end().After(end) {
			end = g.end()
		}
	}
	f.Identities = ids
	f.ID = "folded"
	f.At = end.Add(-f.ValidFor)
	return append([]issued{f}, out[n:]...)
}

// Commit applies a prepared renewal. Nothing may have changed the book
// since Prepare (the coordinator holds the quota's lock across both).
func (b *Book) Commit(p *Pending) {
	if p.isNew {
		b.seq++
	}
	b.regions[p.rec.Region] = p.rec
}

func (b *Book) grantError(id string) error {
	e, s, ok := strings.Cut(id, ".")
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseInt(s, 10, 64)
	if ok && err1 == nil && err2 == nil && (epoch < b.epoch || (epoch == b.epoch && seq <= b.seq)) {
		return fmt.Errorf("grant %s: %w", id, ErrStaleGrant)
	}
	return fmt.Errorf("grant %s: %w", id, ErrUnknownGrant)
}

// Release forgets a lapsed region, dropping its reserved degraded budget
// (an SRE decision: the region is known to be down). A region whose lease
// may still be valid is refused.
func (b *Book) Release(region string, now time.Time) error {
	r := b.regions[region]
	if r == nil {
		return nil
	}
	for _, p := range r.procs {
		if gone, _ := lapsed(p, now); !gone && len(p.out) > 0 {
			return fmt.Errorf("%w: region %q, it expires in %s",
				ErrStillLeased, region, b.expiresIn(r, now).Round(time.Millisecond))
		}
	}
	delete(b.regions, region)
	return nil
}

// Restore loads a region from the durable ledger after a leader change.
// Its lease is assumed granted at now at the persisted amount, the most
// the region may be enforcing, under total (the largest total its grants
// were issued under; 0 for the book's), so the new leader honours it for
// a full lease without needing the old leader's clock. The agent's grant
// id is recognized so its renewal acknowledges it.
func (b *Book) Restore(region, instance, nonce, grantID string, amount, total int64, now time.Time) {
	g := issued{
		Grant:    Grant{ID: grantID, Amount: amount, Epoch: b.epoch, ValidFor: b.timing.ValidFor, Total: total},
		At:       now,
		restored: true,
	}
	b.regions[region] = &Record{Region: region, Instance: instance, Nonce: nonce, Persisted: amount,
		procs: []*process{{nonce: nonce, out: []issued{g}}}, latest: map[string]string{instance: nonce}}
}

// Prune drops outstanding grants that can no longer contribute (expired
// and past any degraded budget), processes left with none, and regions
// left with no process. It returns the regions dropped.
func (b *Book) Prune(now time.Time) []string {
	var dropped []string
	for name, r := range b.regions {
		procs := r.procs[:0]
		for _, p := range r.procs {
			out := p.out[:0]
			for _, g := range p.out {
				if b.contribution(g, g.largest(), now) > 0 || now.Before(g.end()) {
					out = append(out, g)
				}
			}
			if p.out = out; len(out) > 0 {
				procs = append(procs, p)
			}
		}
		if r.procs = procs; len(procs) == 0 {
			delete(b.regions, name)
			dropped = append(dropped, name)
		}
	}
	sort.Strings(dropped)
	return dropped
}

func (b *Book) expiresIn(r *Record, now time.Time) time.Duration {
	return r.current().end().Sub(now)
}

// Status is one region's lease as listed for operators.
type Status struct {
	Region    string
	Instance  string
	GrantID   string
	State     State
	Amount    int64 // currently granted
	Enforcing int64 // may be enforcing (see Book.Enforcing)
	Reserved  int64 // degraded budget kept for a lapsed region
	ExpiresIn time.Duration
	Demand    int64
	Persisted int64
	// Identities are the identities with shares of their own in the
	// current grant, with their amounts.
	Identities map[string]int64
}

// Statuses lists every region's lease at now, sorted by region.
func (b *Book) Statuses(now time.Time) []Status {
	out := make([]Status, 0, len(b.regions))
	for _, r := range b.regions {
		cur := r.current()
		s := Status{Region: r.Region, Instance: r.Instance, GrantID: cur.ID, Amount: cur.Amount, Identities: cur.Identities,
			Enforcing: b.enforcing(r, now), Demand: r.Demand, Persisted: r.Persisted, ExpiresIn: cur.end().Sub(now)}
		live := cur.ID != "" && now.Before(cur.end())
		switch {
		case live && b.shrinks(r, cur.Grant, now):
			s.State = Shrinking
		case live:
			s.State = Active
		case s.Enforcing > 0:
			s.State, s.Reserved, s.ExpiresIn = Degraded, s.Enforcing, 0
		default:
			s.State, s.ExpiresIn = Expired, 0
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out
}

// Demands returns every region's last reported demand.
func (b *Book) Demands() map[string]int64 {
	m := make(map[string]int64, len(b.regions))
	for _, r := range b.regions {
		m[r.Region] = r.Demand
	}
	return m
}

// Shrunk returns the regions whose persisted high-water mark is above what
// they may be enforcing at now, with that lower amount: the ledger can be
// lowered for them in one batched write. The coordinator also lowers them
// in every write that raises a mark, so the marks never sum to more than
// the total.
func (b *Book) Shrunk(now time.Time) map[string]int64 {
	out := map[string]int64{}
	for _, r := range b.regions {
		if e := b.enforcing(r, now); e < r.Persisted {
			out[r.Region] = e
		}
	}
	return out
}

// MarkPersisted records that the ledger now holds amount for region.
func (b *Book) MarkPersisted(region string, amount int64) {
	if r := b.regions[region]; r != nil {
		r.Persisted = amount
	}
}

// Current returns the newest grant of a region and its newest process's
// identity, for the ledger.
func (b *Book) Current(region string) (g Grant, instance, nonce string, ok bool) {
	r := b.regions[region]
	if r == nil {
		return Grant{}, "", "", false
	}
	return r.current().Grant, r.Instance, r.Nonce, true
}

// grantsTotal is the largest total rec's outstanding grants were issued
// under: the ledger keeps it with the region's mark, so a new leader
// reserves the degraded budget the region's agent may fall back to.
func grantsTotal(rec *Record) int64 {
	var t int64
	for _, p := range rec.procs {
		for _, g := range p.out {
			t = max(t, g.Total)
		}
	}
	return t
}
