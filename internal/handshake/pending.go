package handshake

import (
	"container/list"
	"net"
	"sync"
)

// pendingBook holds the pending connections, oldest first, and how many
// each source has: the per-source and total caps are its rule. It is safe
// for concurrent use.
type pendingBook struct {
	perSource, total int

	mu       sync.Mutex
	order    *list.List // of *pending, oldest at the front
	bySource map[string]int
	closed   bool
}

// pending is one connection not yet passed.
type pending struct {
	conn    net.Conn
	source  string
	el      *list.Element // nil once removed
	evicted bool
}

func newPendingBook(perSource, total int) *pendingBook {
	return &pendingBook{perSource: perSource, total: total, order: list.New(), bySource: map[string]int{}}
}

// add books c. ok is false when c's source is at its cap (c is not
// booked) or the book is closed; evicted, when not nil, is the oldest
// pending connection, unbooked to make room for c: the caller closes it.
func (b *pendingBook) add(c net.Conn) (p *pending, evicted *pending, ok bool) {
	src := sourceOf(c.RemoteAddr())
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.bySource[src] >= b.perSource {
		return nil, nil, false
	}
	if b.order.Len() >= b.total {
		evicted = b.order.Front().Value.(*pending)
		evicted.evicted = true
		b.unbookLocked(evicted)
	}
	p = &pending{conn: c, source: src}
	p.el = b.order.PushBack(p)
	b.bySource[src]++
	return p, evicted, true
}

// remove unbooks p (if it still is) and reports whether it was evicted.
func (b *pendingBook) remove(p *pending) (evicted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unbookLocked(p)
	return p.evicted
}

func (b *pendingBook) unbookLocked(p *pending) {
	if p.el == nil {
		return
	}
	b.order.Remove(p.el)
	p.el = nil
	if b.bySource[p.source]--; b.bySource[p.source] <= 0 {
		delete(b.bySource, p.source)
	}
}

// count is how many connections are pending.
func (b *pendingBook) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.order.Len()
}

// closeAll closes every pending connection and refuses new ones.
func (b *pendingBook) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for e := b.order.Front(); e != nil; e = e.Next() {
		e.Value.(*pending).conn.Close()
	}
}

// sourceOf is the IP address of a remote address (the whole address when
// it has no port).
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
