package agent

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"time"

	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// What a region's agents keep in its Redis (regional.Region) so that an
// agent can start, or a region scale out, while the coordinator is
// unreachable: the policy set last loaded and each quota's grant last
// installed. A restoring agent subtracts Config.SavedClockSkew from every
// remaining time, so a wall clock off by up to that much between the hosts
// of a region (NTP keeps them within milliseconds) never lengthens a grant
// or a degraded period.

// saveGrants writes this process's grants that changed since the last
// call (all of them on the first). With prune it also drops saved grants
// of quotas no longer leased.
func (l *leaser) saveGrants(ctx context.Context, prune bool) error {
	now := l.now()
	l.mu.Lock()
	grants := map[string]regional.SavedGrant{}
	written := map[*quotaLease]lease.Grant{}
	for n, q := range l.quotas {
		if !q.a.Own() {
			continue
		}
		g, until := q.a.Grant()
		if q.savedID == g.ID {
			continue
		}
		grants[n] = regional.SavedGrant{
			ID:                g.ID,
			Amount:            g.Amount,
			Identities:        g.Identities,
			Total:             g.Total,
			ValidUntilMs:      now.Add(until.Sub(now)).UnixMilli(),
			DegradedTimeoutMs: q.a.DegradedTimeout().Milliseconds(),
			Fingerprint:       q.fp,
		}
		q.savedID = g.ID
		written[q] = g
	}
	var keep map[string]bool
	if prune {
		keep = make(map[string]bool, len(l.quotas))
		for n := range l.quotas {
			keep[n] = true
		}
	}
	l.mu.Unlock()
	if err := l.shared.SaveGrants(ctx, grants, keep); err != nil {
		l.forgetSaved() // write them all again next time
		return err
	}
	l.mu.Lock()
	for q, g := range written {
		q.durable = g // now it may be acknowledged (leaser.renew)
	}
	l.mu.Unlock()
	return nil
}

// forgetSaved makes the next saveGrants write every grant.
func (l *leaser) forgetSaved() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.quotas {
		q.savedID = ""
	}
}

// restoreGrants installs the region's saved grants in every quota this
// process holds no grant of its own for, and reports how many it
// installed. A grant saved for another version of the policy is skipped.
// Called again every presence round while such quotas remain, it follows
// the grants the region's other instances install.
func (l *leaser) restoreGrants(ctx context.Context, skew time.Duration) (int, error) {
	l.mu.Lock()
	var names []string
	for n, q := range l.quotas {
		if !q.a.Own() {
			names = append(names, n)
		}
	}
	l.mu.Unlock()
	saved, err := l.shared.LoadGrants(ctx, names)
	if err != nil {
		return 0, err
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for name, g := range saved {
		q := l.quotas[name]
		if q == nil || q.fp != g.Fingerprint || q.a.Own() {
			continue
		}
		left := time.Duration(g.ValidUntilMs-now.UnixMilli())*time.Millisecond - skew
		q.a.SetDegradedTimeout(time.Duration(g.DegradedTimeoutMs) * time.Millisecond)
		q.a.Restore(lease.Grant{ID: g.ID, Amount: g.Amount, Identities: g.Identities, Total: g.Total}, now.Add(left))
		n++
	}
	return n, nil
}

// policySetFingerprint identifies a policy set by its policies'
// fingerprints, in order.
func policySetFingerprint(ps []*policy.Policy) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, p := range ps {
		binary.LittleEndian.PutUint64(b[:], p.Fingerprint())
		h.Write(b[:])
	}
	return h.Sum64()
}
