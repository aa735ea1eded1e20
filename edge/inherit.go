package edge

import "time"

// A restarted agent (SIGKILL and started again under its instance name, as
// a StatefulSet or systemd restarts it) takes over its predecessor's
// Envoy instances: their streams reopen to it. Their buckets from the dead
// process may still be enforced until they expire, and the region's store
// keeps that process's reservation for them, so without more the new
// process could assign nothing until the old entry expired, and its
// instances went dark for most of ten seconds.
//
// So the store moves the dead process's reservation to its successor's
// entry with the first write of each identity (it was counted by every
// agent already, so it is usable at once), with what bounds the buckets
// it covers: how many instances held one (places) and the largest share
// any one of them held (Update.Largest, which every agent keeps in its
// entry). The successor's ledger counts them as a pool until the old
// entry would have expired: each instance that reports to it is taken to
// be one of the pool's (adopted) and may hold up to Largest, the rest up
// to Largest each and Reserved in all. A reopening instance then gets its
// bucket as soon as its stream does. As with the places, this takes the
// instances that report to the successor for its predecessor's: a
// predecessor's instance that reconnects to another agent of the region
// while a new one connects to the successor counts one instance short, up
// to Largest, until the old entry would have expired.

// Inheritance is what the store moved from the process an agent succeeded
// for one policy identity: its reservation, the largest share one of its
// instances may hold, how many instances it assigned to, how long its
// entry had left, on the store's clock, and its edge and direct demands.
type Inheritance struct {
	Reserved, Largest, Places int64
	Left                      time.Duration
	Edge, Direct              int64
}

// Without returns o, read before the store moved the predecessor's entry,
// without it: what the others hold now.
func (o Others) Without(in Inheritance) Others {
	return Others{
		Reserved: max(0, o.Reserved-in.Reserved),
		Edge:     max(0, o.Edge-in.Edge),
		Direct:   max(0, o.Direct-in.Direct),
	}
}

// pool is the predecessor's instances not adopted yet, each holding up to
// largest, total in all, until end.
type pool struct {
	places, largest, total int64
	end                    time.Time
}

// Inherit adds in, answered at done, to the ledger's pool; the entry's
// time left is on the store's clock, which may run slow by drift.
func (l *Ledger[K]) Inherit(in Inheritance, done time.Time, drift float64) {
	if in.Reserved <= 0 || in.Places <= 0 {
		return
	}
	largest := in.Largest
	if largest <= 0 || largest > in.Reserved {
		largest = in.Reserved // an entry written before Largest was kept
	}
	end := done.Add(Lifetime(in.Left, drift, 0))
	p := &l.pool
	p.places, p.largest, p.total = p.places+in.Places, max(p.largest, largest), p.total+in.Reserved
	p.end = later(p.end, end)
}

// Adopt takes slot k for one of the pool's instances, once: it may hold
// up to the pool's largest share until the pool ends (or less, if this
// agent already replaced that bucket: counted all the same).
func (l *Ledger[K]) Adopt(k K, now time.Time) {
	p := &l.pool
	if p.places <= 0 || !now.Before(p.end) {
		return
	}
	s := l.slots[k]
	if s == nil {
		s = &slot{}
		l.slots[k] = s
	}
	if s.adopted {
		return
	}
	p.places--
	s.adopted, s.held = true, append(s.held, held{p.largest, p.end, true})
}

// pooled is what the pool's instances not adopted may still enforce.
func (l *Ledger[K]) pooled(now time.Time) int64 {
	p := &l.pool
	if !now.Before(p.end) {
		*p = pool{}
		return 0
	}
	if p.places <= 0 {
		return 0
	}
	if p.largest > p.total/p.places {
		return p.total // all of them cannot hold the largest
	}
	return p.places * p.largest
}
