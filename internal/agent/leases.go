package agent

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// unsaved reports whether a grant of this process is not yet saved in the
// region's Redis, and so may not be acknowledged.
func (l *leaser) unsaved() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.quotas {
		if g, _ := q.a.Grant(); q.a.Own() && g.ID != q.durable.ID {
			return true
		}
	}
	return false
}

// setPolicies starts leasing new global policies and forgets deleted ones.
// A policy whose algorithm changed starts a new lease.
func (l *leaser) setPolicies(ps []*policy.Policy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := map[string]bool{}
	for _, p := range ps {
		if p.Scope != policy.ScopeGlobal {
			continue
		}
		keep[p.Name] = true
		q := l.quotas[p.Name]
		if q == nil || q.policy.Algorithm != p.Algorithm {
			q = &quotaLease{
				a:     lease.NewHolder(l.timing, p.Failure, p.Limits().Amount()),
				meter: newMeter(lease.MeterTracks(p.IdentityShareLimit())),
			}
			l.quotas[p.Name] = q
		}
		q.a.SetPolicy(p.Failure, p.Limits().Amount()) // a changed failure mode applies at once
		q.meter.setTracks(lease.MeterTracks(p.IdentityShareLimit()))
		q.policy, q.fp = p, p.Fingerprint()
	}
	for name := range l.quotas {
		if !keep[name] {
			delete(l.quotas, name)
		}
	}
}

// renewAt is when the next renewal falls due: the earliest of the
// leases' (lease.Holder.RenewAt; the zero time: now), not before a
// refusal's back-off ends. ok is false when nothing is leased.
func (l *leaser) renewAt() (at time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.quotas {
		r := q.a.RenewAt()
		if r.IsZero() {
			return l.heldUntil, true
		}
		if !ok || r.Before(at) {
			at, ok = r, true
		}
	}
	if ok && at.Before(l.heldUntil) {
		at = l.heldUntil
	}
	return at, ok
}

// firstRoundTimeout bounds a lease round before any grant says how often
// to renew.
const firstRoundTimeout = 3 * time.Second

// renewInterval is the shortest renewal interval of the grants held
// (firstRoundTimeout before any): how long a lease round may take.
func (l *leaser) renewInterval() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := time.Duration(0)
	for _, q := range l.quotas {
		if r := q.a.RenewInterval(); r > 0 && (d == 0 || r < d) {
			d = r
		}
	}
	if d == 0 {
		return firstRoundTimeout
	}
	return d
}

// names returns the global policies being leased.
func (l *leaser) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.quotas))
}

// unleased returns the global policies that cannot be decided yet: no
// grant, no restored one, and no lease request answered or failed.
func (l *leaser) unleased(now time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for n, q := range l.quotas {
		if _, m := q.a.Enforce("", now); m == lease.ModeNone {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Enforce returns the amount policy name may enforce now for identity,
// and the mode (admission.Shares).
func (l *leaser) Enforce(name, identity string, now time.Time) (int64, lease.Mode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.quotas[name]
	if q == nil {
		return 0, lease.ModeNone
	}
	return q.a.Enforce(identity, now)
}

// EnforceAt is Enforce as it will be at a later time, if no answer comes
// before (lease.Holder.EnforceAt); it changes nothing.
func (l *leaser) EnforceAt(name, identity string, at time.Time) (int64, lease.Mode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.quotas[name]
	if q == nil {
		return 0, lease.ModeNone
	}
	return q.a.EnforceAt(identity, at)
}

// Observe counts cost (micro-units) asked of policy name by identity over
// span up to now (0: a check at now): its demand.
func (l *leaser) Observe(name, identity string, cost int64, span time.Duration, now time.Time) {
	l.mu.Lock()
	q := l.quotas[name]
	own := false
	if q != nil {
		g, _ := q.a.Grant()
		own = g.Owns(identity)
	}
	l.mu.Unlock()
	if q != nil {
		q.meter.add(identity, cost, own, span, now)
	}
}

// Instances is how many live instances of the region enforce its share
// (admission.Shares).
func (l *leaser) Instances() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.instances
}

// renewalEdge is what a renewal asks of the edge (rlqs.Engine): whether
// acknowledging grant g of quota name would free what Envoy instances may
// still be enforcing (the renewal then presents the grant acknowledged
// before instead), and what to report of the quota's edge (nil: nothing).
type renewalEdge interface {
	Holds(name string, g lease.Grant, now time.Time) bool
	Summary(name string) *pb.EdgeSummary
}

// renew sends one request for every quota whose renewal is due and
// applies the answers, holding back the grants edge may still be enforcing
// (nil: no edge). It reports whether all of them got grants.
func (l *leaser) renew(ctx context.Context, edge renewalEdge) bool {
	if l.unsaved() {
		if err := l.saveGrants(ctx, false); err != nil {
			l.log.Debug("grants not saved before renewing; acknowledging the last saved ones", "error", err)
		}
	}
	now := l.now()
	l.mu.Lock()
	if now.Before(l.heldUntil) {
		l.mu.Unlock()
		return false
	}
	var out []sentQuota
	pr := &pb.LeaseRequest{Region: l.region, Instance: l.instance, Nonce: l.nonce, Replaces: l.replaces}
	for _, n := range slices.Sorted(maps.Keys(l.quotas)) {
		q := l.quotas[n]
		if !q.a.NeedsRenewal(now) {
			continue
		}
		r := q.a.Sending(now)
		demand := max(q.region, q.policy.Limits().RateAmount(q.meter.rate(now)))
		base := q.durable // acknowledge the last grant saved, or none
		if r.GrantID == "" {
			base = lease.Grant{} // the lease asks anew (its grant was refused as stale or unknown)
		}
		if base.ID != "" && base.ID != q.acked.ID && edge != nil && edge.Holds(n, base, now) {
			// Envoy instances may still enforce assignments of a larger
			// share than base gives: the coordinator keeps counting the
			// grant that covered them (or, if none is known, every grant)
			// until they expire.
			base = q.acked
		}
		q.acked = base
		most := leaseapi.MaxIdentityDemands
		if !q.demandsTaken { // a coordinator that takes whole reports (or none yet): send one
			q.report, most = lease.DemandReport{}, leaseapi.MaxWholeDemands
		}
		var changes map[string]int64
		// A process that succeeded another under its name sends none
		// until it has measured for a second: the coordinator keeps its
		// predecessor's meanwhile (lease.IdentityPlan.Update).
		if l.predecessor == "" && l.replaces == "" || q.meter.warm(now) {
			changes = q.report.Changes(q.identityDemand(now, l.instances), q.policy.Limits().Amount(), most)
		}
		qr := &pb.QuotaRequest{Quota: n, GrantId: base.ID, Seq: r.Seq, Demand: demand,
			IdentityDemand: changes, IdentityDemandHeld: int32(q.report.Len()), IdentityDeltas: true}
		if edge != nil {
			qr.Edge = edge.Summary(n)
		}
		pr.Quotas = append(pr.Quotas, qr)
		out = append(out, sentQuota{n, q, r, base, changes})
	}
	l.mu.Unlock()
	if len(out) == 0 {
		return true
	}
	// Within the coordinator's limits on quotas and bytes per request: more
	// is renewed in several requests, never refused as one.
	ok := true
	for _, part := range leaseapi.Split(pr.Quotas) {
		req := &pb.LeaseRequest{
			Region:   pr.Region,
			Instance: pr.Instance,
			Nonce:    pr.Nonce,
			Replaces: pr.Replaces,
			Quotas:   pr.Quotas[part.Start:part.End],
		}
		resp, err := l.coord.Lease(ctx, req)
		ok = l.answered(out[part.Start:part.End], resp, err) && ok
	}
	l.mu.Lock()
	held := l.wasHeld
	l.wasHeld = false
	l.mu.Unlock()
	if held {
		if err := l.succeed(ctx); err != nil {
			l.log.Debug("could not tell whether the name's holder has stopped", "error", err)
		}
	}
	return ok
}

// renewFailReason is the metric reason of a renewal that failed as a
// whole: rate-limited when the coordinator refused it for this region's
// call rate (ResourceExhausted: something loops or floods, it is not
// down), unavailable otherwise.
func renewFailReason(err error) string {
	if status.Code(err) == codes.ResourceExhausted {
		return "rate-limited"
	}
	return "unavailable"
}

// sentQuota is one quota of a renewal request.
type sentQuota struct {
	name    string
	q       *quotaLease
	req     lease.Request
	base    lease.Grant      // the grant acknowledged
	changes map[string]int64 // the identity demands reported
}

// answered applies the coordinator's answer (or its failure) to the quotas
// of one renewal request, each matched to its grant by name; a quota the
// answer leaves out counts as refused.
func (l *leaser) answered(out []sentQuota, resp *pb.LeaseResponse, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		for _, s := range out {
			s.q.a.Failed(s.req, err)
		}
		if wait, held := leaseapi.InstanceHeld(err, l.timing.ValidFor); held {
			l.backOff(wait, err)
			l.wasHeld = true
			return false
		}
		l.m.renewFails.WithLabelValues(renewFailReason(err)).Inc()
		l.down.Failed(l.log, l.now(), "quotas", len(out), "error", err)
		return false
	}
	l.down.OK(l.log, l.now())
	l.named, l.replaces = true, ""
	if resp.AssumedDrift > l.timing.Drift {
		l.log.Warn("the coordinator assumes a larger clock drift than this agent's --drift; using the "+
			"coordinator's", "agent", l.timing.Drift, "coordinator", resp.AssumedDrift)
		l.timing.Drift = resp.AssumedDrift
		for _, q := range l.quotas {
			q.a.RaiseDrift(resp.AssumedDrift)
		}
	}
	ok, stale, dup := true, false, false
	var refused refusals
	defer func() {
		refused.log(l.log)
		if !dup {
			l.held.OK(l.log, l.now())
		}
		if stale && l.stale != nil {
			l.stale()
		}
	}()
	grants := leaseapi.Index(resp)
	for _, s := range out {
		g, err := grants.Lookup(s.name)
		var grant lease.Grant
		var terms leaseapi.Terms
		if err == nil {
			s.q.demandsTaken = g.IdentityDemandTaken
			if g.IdentityDemandTaken {
				s.q.report.Answered(s.changes, !g.IdentityDemandReset)
			}
			grant, terms, err = leaseapi.DecodeGrant(g, s.q.policy.Algorithm, resp.Epoch, s.base)
		}
		if refusesGrant(err) && s.q.durable.ID == s.base.ID {
			s.q.durable = lease.Grant{} // never present it again: ask anew
		}
		if refusesGrant(err) && s.q.acked.ID == s.base.ID {
			s.q.acked = lease.Grant{}
		}
		if errors.Is(err, lease.ErrDuplicateInstance) {
			// Another process took this instance name while this one was
			// cut off; it keeps it while it renews.
			s.q.a.Failed(s.req, err)
			l.backOff(l.timing.ValidFor, err)
			ok, dup = false, true
			continue
		}
		if err != nil {
			s.q.a.Failed(s.req, err)
			l.m.renewFails.WithLabelValues("refused").Inc()
			refused.add(s.name, err)
			ok = false
			continue
		}
		if terms.Fingerprint != 0 && terms.Fingerprint != s.q.fp {
			stale = true
		}
		s.q.a.SetDegradedTimeout(terms.DegradedTimeout)
		grant.RenewAfter = terms.RenewAfter
		s.q.a.Granted(s.req, grant)
	}
	return ok
}

// backOff stops lease requests for wait because another agent process
// holds this instance name (err says which and what to do): counted as a
// refusal, logged when it starts and then at most every 30 s. l.mu is held.
func (l *leaser) backOff(wait time.Duration, err error) {
	now := l.now()
	l.heldUntil = now.Add(wait)
	l.m.renewFails.WithLabelValues("refused").Inc()
	l.held.Failed(l.log, now, "retry_in", wait.Round(time.Millisecond), "error", err)
}

// refusesGrant reports whether err refuses the grant a renewal presented
// (stale, unknown, or not the base of the answer's identity shares): the
// agent must not present it again.
func refusesGrant(err error) bool {
	return errors.Is(err, lease.ErrStaleGrant) ||
		errors.Is(err, lease.ErrUnknownGrant) ||
		errors.Is(err, leaseapi.ErrIdentityBase)
}

// publish writes this instance's demand per quota to Redis and reads the
// region's: the sum over processes seen in the last staleAfter, and how
// many instances that is (a process restarted under its name and the one
// it replaced, both seen for a moment, are one instance).
func (l *leaser) publish(ctx context.Context, staleAfter time.Duration) error {
	now := l.now()
	l.mu.Lock()
	p := regional.Presence{Nonce: l.nonce, At: now, Quota: make(map[string]int64, len(l.quotas)), Holds: l.holds()}
	for n, q := range l.quotas {
		p.Quota[n] = q.policy.Limits().RateAmount(q.meter.rate(now))
	}
	l.mu.Unlock()
	region, err := l.shared.Publish(ctx, p, staleAfter)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.instances = region.Instances
	for n, q := range l.quotas {
		q.region = region.Demand[n]
	}
	l.mu.Unlock()
	l.m.instances.Set(float64(region.Instances))
	return nil
}

// updateMetrics refreshes the lease gauges.
func (l *leaser) updateMetrics(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dt := time.Duration(0)
	if !l.metricsAt.IsZero() {
		dt = now.Sub(l.metricsAt)
	}
	l.metricsAt = now
	for n, q := range l.quotas {
		amt, mode := q.a.Enforce("", now)
		degraded := l.m.degradedSeconds.WithLabelValues(n) // created at zero
		if mode == lease.ModeDegraded && dt > 0 {
			degraded.Add(dt.Seconds())
		}
		total := q.policy.Limits().Amount()
		l.m.leaseShare.WithLabelValues(n).Set(q.policy.Limit * float64(amt) / float64(total))
		st := q.a.State(now)
		for _, s := range []lease.State{lease.Requested, lease.Active, lease.Renewing, lease.Expired, lease.Degraded} {
			v := 0.0
			if s == st {
				v = 1
			}
			l.m.leaseState.WithLabelValues(n, string(s)).Set(v)
		}
	}
}

// ValidUntil is when this process's grant of policy name stops holding,
// on its clock (zero without one).
func (l *leaser) ValidUntil(name string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.quotas[name]
	if q == nil {
		return time.Time{}
	}
	g, until := q.a.Grant()
	if g.ID == "" {
		return time.Time{}
	}
	return until
}
