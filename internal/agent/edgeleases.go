package agent

import "time"

// What the edge engine asks of the leases.

// validUntil is when this process's grant of policy name stops holding,
// on its clock (zero without one).
func (l *leaser) validUntil(name string) time.Time {
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
