package handshake

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// tlsConfigs returns a server configuration and a client one that trusts
// it, from a throwaway CA.
func tlsConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	ca, err := devca.New(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := ca.Issue(devca.Leaf{Name: "server"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{cert}}, &tls.Config{RootCAs: pool, ServerName: "localhost"}
}

// failures counts the connections a Listener reports, by reason.
type failures struct {
	mu sync.Mutex
	n  map[string]int
}

func (f *failures) add(reason string, _ net.Addr, _ error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	f.n[reason]++
}

func (f *failures) get(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[reason]
}

// listen starts a Listener on loopback with cfg changed by mod, and a
// server that answers every passed connection's line with "ok\n".
func listen(t *testing.T, mod func(*Config)) (*Listener, *failures) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &failures{}
	cfg := DefaultConfig()
	cfg.Failed = f.add
	mod(&cfg)
	l, err := New(inner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var b [64]byte
				if n, err := c.Read(b[:]); err == nil && n > 0 {
					c.Write([]byte("ok\n"))
				}
			}()
		}
	}()
	return l, f
}

// dialFrom opens a TCP connection to l from the loopback address src,
// closed at the end of t.
func dialFrom(t *testing.T, l net.Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (a read ends in EOF
// or a reset), waiting at most 10 s: long enough that only a connection
// left open fails it.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// ask handshakes over c as a TLS client and sends a line: the server
// answers "ok" only through a connection that passed.
func ask(t *testing.T, c net.Conn, client *tls.Config) {
	t.Helper()
	tc := tls.Client(c, client)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	var b [3]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil || string(b[:]) != "ok\n" {
		t.Fatalf("answer %q %v", b, err)
	}
}

// A connection that sends nothing, and one that trickles its handshake a
// byte at a time, are both closed at the deadline and counted as timeouts;
// a client that handshakes is answered.
func TestStalledHandshakeClosedAtDeadline(t *testing.T) {
	server, client := tlsConfigs(t)
	l, f := listen(t, func(c *Config) { c.TLS, c.Timeout = server, 200*time.Millisecond })
	idle := dialFrom(t, l, "127.0.0.1")
	trickle := dialFrom(t, l, "127.0.0.1")
	stop := make(chan struct{})
	go func() { // a ClientHello's record header, a byte every 20 ms, 100 at most
		hello := []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}
		for i := 0; i < 100; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := trickle.Write(hello[i%len(hello) : i%len(hello)+1]); err != nil {
				return
			}
		}
	}()
	defer close(stop)
	if !closedByServer(idle) || !closedByServer(trickle) {
		t.Fatal("a stalled handshake was still open 10 s after its 200 ms deadline")
	}
	testenv.WaitFor(t, 5*time.Second, "two timeouts counted", func() bool { return f.get(ReasonTimeout) == 2 })
	ask(t, dialFrom(t, l, "127.0.0.1"), client)
	if l.Pending() != 0 {
		t.Fatalf("%d still pending", l.Pending())
	}
}

// Past the per-source cap, the source's oldest pending connections are
// closed for its new ones, and counted; a client from the same source is
// served meanwhile.
func TestPerSourceCap(t *testing.T) {
	server, client := tlsConfigs(t)
	l, f := listen(t, func(c *Config) { c.TLS, c.Timeout, c.PerSource, c.Total = server, time.Minute, 4, 100 })
	var conns []net.Conn
	for i := 0; i < 6; i++ {
		conns = append(conns, dialFrom(t, l, "127.0.0.1"))
		testenv.WaitFor(t, 5*time.Second, "booked in order", func() bool { return l.Pending()+f.get(ReasonSourceLimit) == len(conns) })
	}
	testenv.WaitFor(t, 5*time.Second, "4 pending and 2 closed", func() bool { return l.Pending() == 4 && f.get(ReasonSourceLimit) == 2 })
	if !closedByServer(conns[0]) || !closedByServer(conns[1]) {
		t.Fatal("the two oldest of the source were not the ones closed")
	}
	ask(t, dialFrom(t, l, "127.0.0.1"), client)
}

// Past the total cap, the oldest pending connection is closed for the new
// one: connections that never handshake cannot keep a client out.
func TestTotalCapEvictsOldest(t *testing.T) {
	server, client := tlsConfigs(t)
	l, f := listen(t, func(c *Config) { c.TLS, c.Timeout, c.PerSource, c.Total = server, time.Minute, 4, 8 })
	var conns []net.Conn
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		for i := 0; i < 4; i++ {
			conns = append(conns, dialFrom(t, l, src))
			testenv.WaitFor(t, 5*time.Second, "booked in order", func() bool { return l.Pending() == len(conns) })
		}
	}
	for i := 0; i < 2; i++ {
		conns = append(conns, dialFrom(t, l, "127.0.0.4"))
		testenv.WaitFor(t, 5*time.Second, "booked in order", func() bool { return f.get(ReasonEvicted) == i+1 })
	}
	testenv.WaitFor(t, 5*time.Second, "2 evicted", func() bool { return f.get(ReasonEvicted) == 2 })
	if !closedByServer(conns[0]) || !closedByServer(conns[1]) {
		t.Fatal("the two oldest were not the ones closed")
	}
	if l.Pending() != 8 {
		t.Fatalf("%d pending, want the cap 8", l.Pending())
	}
	ask(t, dialFrom(t, l, "127.0.0.5"), client) // evicts one more, and is served
}

// Under 400 connections that send nothing, from 25 sources, a client is
// answered and the listener holds at most its total cap of them: the
// process's descriptors grow by the clients' own 400 and at most the cap.
func TestIdleFloodBounded(t *testing.T) {
	server, client := tlsConfigs(t)
	l, _ := listen(t, func(c *Config) { c.TLS, c.Timeout, c.PerSource, c.Total = server, time.Minute, 16, 64 })
	before := openFDs(t)
	const sources, perSource = 25, 16
	for s := 0; s < sources; s++ {
		for i := 0; i < perSource; i++ {
			dialFrom(t, l, net.IPv4(127, 0, 1, byte(10+s)).String())
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the cap reached", func() bool { return l.Pending() == 64 })
	ask(t, dialFrom(t, l, "127.0.0.1"), client)
	if l.Pending() > 64 {
		t.Fatalf("%d pending over the cap of 64", l.Pending())
	}
	// The clients' 401 descriptors, at most 64 pending on the server, the
	// answered client's server side, and a few the runtime may open.
	if grown := openFDs(t) - before; grown > sources*perSource+1+64+1+8 {
		t.Fatalf("descriptors grew by %d holding %d idle connections", grown, sources*perSource)
	}
}

// Without TLS a connection passes with its first byte, which the server
// then reads; one that sends nothing is closed at the deadline.
func TestPlaintextFirstByte(t *testing.T) {
	l, f := listen(t, func(c *Config) { c.Timeout = 200 * time.Millisecond })
	c := dialFrom(t, l, "127.0.0.1")
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("x"))
	var b [3]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ok\n" {
		t.Fatalf("answer %q %v", b, err)
	}
	if !closedByServer(dialFrom(t, l, "127.0.0.1")) {
		t.Fatal("an idle plaintext connection was not closed")
	}
	testenv.WaitFor(t, 5*time.Second, "a timeout counted", func() bool { return f.get(ReasonTimeout) == 1 })
}

// Close ends Accept and closes what is pending.
func TestCloseClosesPending(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Timeout = time.Minute
	l, err := New(inner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, l, "127.0.0.1")
	testenv.WaitFor(t, 5*time.Second, "pending", func() bool { return l.Pending() == 1 })
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if !closedByServer(c) {
		t.Fatal("a pending connection outlived Close")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (Config{Timeout: 0, PerSource: 4, Total: 2}).Validate(); err == nil {
		t.Fatal("a zero timeout and a total under the per-source cap accepted")
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}

// Connections are counted per IPv4 address and per IPv6 /64, which one
// host commonly holds whole.
func TestSourceOf(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.7:443":                      "192.0.2.7",
		"[2001:db8:1:2:aaaa::1]:443":         "2001:db8:1:2::/64",
		"[2001:db8:1:2:bbbb:cccc:dddd:1]:80": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:80":               "2001:db8:1:3::/64",
		"[::ffff:192.0.2.7]:443":             "192.0.2.7",
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := sourceOf(a); got != want {
			t.Errorf("%s: source %q, want %q", addr, got, want)
		}
	}
}
