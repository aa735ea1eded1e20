// Package faultproxy is a TCP proxy for fault tests: it forwards to an
// upstream on loopback and can add latency to every chunk of data or cut
// every connection, so tests can make a real Redis slow or gone.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from Addr to an upstream.
type Proxy struct {
	// Addr is the proxy's listening address (127.0.0.1:port).
	Addr string

	upstream string
	lis      net.Listener
	delay    atomic.Int64 // nanoseconds added before forwarding each chunk
	cut      atomic.Bool
	stalled  atomic.Bool // forward nothing, close nothing: a host paused or partitioned away

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// Start listens on a free loopback port and forwards to upstream.
func Start(upstream string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: lis.Addr().String(), upstream: upstream, lis: lis, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetDelay adds d before every forwarded chunk, both ways.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.cut.Store(true)
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

// Stall stops forwarding on every connection, without closing any, until
// Restore: what a peer sees of a host paused or partitioned away. New
// connections are accepted and stall too.
func (p *Proxy) Stall() { p.stalled.Store(true) }

// Restore accepts connections again, with no delay, and forwards again.
func (p *Proxy) Restore() {
	p.SetDelay(0)
	p.stalled.Store(false)
	p.cut.Store(false)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.lis.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, up)
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) track(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		p.conns[c] = true
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			for p.stalled.Load() && !p.cut.Load() { // Close cuts
				time.Sleep(5 * time.Millisecond)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a cut: close both sides
			return
		}
	}
}
