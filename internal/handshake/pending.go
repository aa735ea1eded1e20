package handshake

import (
	"container/list"
	"net"
	"sync"
)

// pendingBook holds the pending connections, oldest first, in all and
// per source: the per-source and total caps are its rule. A new
// connection past a cap takes the place of the oldest one under it (of
// its source, or of all), which is closed: a client that handshakes in
// milliseconds gets through however many stalled connections share its
// address or the listener, and the stalled ones only ever displace each
// other. It is safe for concurrent use.
type pendingBook struct {
	perSource, total int

	mu       sync.Mutex
	order    *list.List            // of *pending, oldest at the front
	bySource map[string]*list.List // the same, per source
	closed   bool
}

// pending is one connection not yet passed.
type pending struct {
	conn    net.Conn
	source  string
	el, sel *list.Element // in order and in bySource; nil once removed
	evicted string        // why it was closed for another: a Reason, or ""
}

func newPendingBook(perSource, total int) *pendingBook {
	return &pendingBook{perSource: perSource, total: total, order: list.New(), bySource: map[string]*list.List{}}
}

// add books c; ok is false when the book is closed. evicted, when not
// nil, is the connection unbooked to make room for c (the oldest of c's
// source, or of all): the caller closes it.
func (b *pendingBook) add(c net.Conn) (p *pending, evicted *pending, ok bool) {
	src := sourceOf(c.RemoteAddr())
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, false
	}
	same := b.bySource[src]
	switch {
	case same != nil && same.Len() >= b.perSource:
		evicted = same.Front().Value.(*pending)
		evicted.evicted = ReasonSourceLimit
	case b.order.Len() >= b.total:
		evicted = b.order.Front().Value.(*pending)
		evicted.evicted = ReasonEvicted
	}
	if evicted != nil {
		b.unbookLocked(evicted)
	}
	if same = b.bySource[src]; same == nil {
		same = list.New()
		b.bySource[src] = same
	}
	p = &pending{conn: c, source: src}
	p.el, p.sel = b.order.PushBack(p), same.PushBack(p)
	return p, evicted, true
}

// remove unbooks p (if it still is) and returns why it was evicted, or "".
func (b *pendingBook) remove(p *pending) (evicted string) {
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
	same := b.bySource[p.source]
	same.Remove(p.sel)
	if same.Len() == 0 {
		delete(b.bySource, p.source)
	}
	p.el, p.sel = nil, nil
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

// sourceOf is what a remote address's connections are counted under: its
// IPv4 address, its IPv6 /64, or the whole address when it has no port.
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ta.IP.To4() == nil && len(ta.IP) == net.IPv6len {
			// One IPv6 host commonly holds a whole /64: count it as one.
			return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
		}
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
