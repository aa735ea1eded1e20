// Package handshake is a listener that lets a connection through only once
// it has shown it is a client: its TLS handshake completed (or, without
// TLS, its first byte arrived), within a deadline. Until then a connection
// is pending, and pending connections are bounded per source address and
// in total, so that connections that trickle a handshake or send nothing
// (a slowloris, a port scan, a stuck client) cannot hold the server's
// connection slots, descriptors or memory: past either cap the oldest
// pending connection (of the source, or of all) is closed for the new
// one. The server behind it (net/http) sees only connections that
// passed, as *tls.Conn with the handshake done.
package handshake

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Config configures a Listener. Start from DefaultConfig.
type Config struct {
	// TLS, when set, is the server configuration handshakes use; nil: the
	// connection passes once its first byte arrives.
	TLS *tls.Config
	// Timeout is how long a connection may take to pass.
	Timeout time.Duration
	// PerSource bounds the connections pending from one IP address, Total
	// those pending from all.
	PerSource, Total int
	// Failed, when set, is told every connection that did not pass, with
	// why (a Reason constant) and the error; it is called from the
	// connection's goroutine and must be quick and safe for concurrent use.
	Failed func(reason string, remote net.Addr, err error)
}

// DefaultConfig is a handshake deadline of 3 s, at most 64 pending
// connections per source and 1,024 in all: a client on the network
// handshakes in milliseconds, so a source with 64 handshakes in flight at
// once is a flood, not a client; and a pending connection costs a
// descriptor, a goroutine and some kilobytes, so a thousand of them wait
// out their deadline cheaply, where closing them early would have their
// sender reconnect at once, a costlier flood.
func DefaultConfig() Config { return Config{Timeout: 3 * time.Second, PerSource: 64, Total: 1024} }

// Validate reports every setting of c that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("handshake timeout %s must be positive", c.Timeout))
	}
	if c.PerSource < 1 || c.Total < c.PerSource {
		errs = append(errs, fmt.Errorf("pending per source %d must be at least 1 and at most the total %d",
			c.PerSource, c.Total))
	}
	return errors.Join(errs...)
}

// Listener is a net.Listener whose Accept returns connections that passed.
// Its own goroutine accepts from the listener it wraps; Close stops it and
// closes every pending connection.
type Listener struct {
	inner  net.Listener
	cfg    Config
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	ready  chan net.Conn // connections that passed, waiting for Accept
	done   chan struct{} // the accept loop ended
	err    error         // why it ended (set before done is closed)
	book   *pendingBook
}

// New wraps inner and starts accepting from it.
func New(inner net.Listener, cfg Config) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("handshake listener: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{inner: inner, cfg: cfg, ctx: ctx, cancel: cancel, ready: make(chan net.Conn), done: make(chan struct{}),
		book: newPendingBook(cfg.PerSource, cfg.Total)}
	go l.acceptLoop()
	return l, nil
}

// Accept returns the next connection that passed: a *tls.Conn whose
// handshake is done, or, without TLS, a net.Conn that replays the first
// byte.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// Close stops accepting, closes the wrapped listener and every pending
// connection.
func (l *Listener) Close() error {
	l.cancel()
	err := l.inner.Close()
	l.book.closeAll()
	return err
}

// Addr is the wrapped listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Pending is how many connections are pending now.
func (l *Listener) Pending() int { return l.book.count() }

// acceptLoop accepts from inner until it fails for good, retrying
// temporary failures (too many open files, say) with a backoff of 5 ms up
// to 1 s, as net/http does.
func (l *Listener) acceptLoop() {
	defer close(l.done)
	backoff := time.Duration(0)
	for {
		c, err := l.inner.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-l.ctx.Done():
				}
			}
			l.err = err
			if l.ctx.Err() != nil {
				l.err = net.ErrClosed
			}
			return
		}
		backoff = 0
		l.admit(c)
	}
}

// isTemporary reports an accept error worth retrying.
func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// admit books c as pending; past a cap the oldest pending connection of
// its source, or of all, is closed for it.
func (l *Listener) admit(c net.Conn) {
	p, evicted, ok := l.book.add(c)
	if evicted != nil {
		evicted.conn.Close() // its goroutine reports it
	}
	if !ok { // closed
		c.Close()
		return
	}
	go l.pass(p)
}

// pass waits for p's handshake (or first byte) within the deadline, then
// hands the connection to Accept.
func (l *Listener) pass(p *pending) {
	raw := p.conn
	deadline := time.Now().Add(l.cfg.Timeout) // the network poller's clock: net.Conn deadlines are wall-clock values
	raw.SetDeadline(deadline)
	ctx, cancel := context.WithDeadline(l.ctx, deadline)
	conn, err := l.handshake(ctx, raw)
	cancel()
	evicted := l.book.remove(p)
	if err == nil {
		err = raw.SetDeadline(time.Time{}) // the server sets its own from here
	}
	if err != nil {
		raw.Close()
		reason := evicted
		switch {
		case reason != "":
		case isTimeout(err):
			reason = ReasonTimeout
		default:
			reason = ReasonError
		}
		if l.ctx.Err() == nil {
			l.failed(reason, raw.RemoteAddr(), err)
		}
		return
	}
	select {
	case l.ready <- conn:
	case <-l.ctx.Done():
		conn.Close()
	}
}

// handshake is the test a connection passes: a TLS handshake, or a first
// byte.
func (l *Listener) handshake(ctx context.Context, raw net.Conn) (net.Conn, error) {
	if l.cfg.TLS != nil {
		tc := tls.Server(raw, l.cfg.TLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		return tc, nil
	}
	var b [1]byte
	if _, err := raw.Read(b[:]); err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: raw, first: b[0], has: true}, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func (l *Listener) failed(reason string, remote net.Addr, err error) {
	if l.cfg.Failed != nil {
		l.cfg.Failed(reason, remote, err)
	}
}

// firstByteConn is a plaintext connection whose first byte was read to
// let it pass; it reads that byte first.
type firstByteConn struct {
	net.Conn
	first byte
	has   bool
}

func (c *firstByteConn) Read(b []byte) (int, error) {
	if c.has && len(b) > 0 {
		b[0], c.has = c.first, false
		return 1, nil
	}
	return c.Conn.Read(b)
}
