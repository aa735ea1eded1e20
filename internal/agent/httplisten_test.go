package agent

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/handshake"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// agentTLS returns the TLS configurations of an agent's HTTP listener,
// as the agent serve command makes it (client certificates optional), and
// of a client presenting a certificate, from a throwaway CA.
func agentTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca, err := devca.New(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey, err := ca.Issue(devca.Leaf{Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	cliCert, cliKey, err := ca.Issue(devca.Leaf{Name: "service"})
	if err != nil {
		t.Fatal(err)
	}
	if server, err = mtls.ServerOptionalClient(mtls.Files{Cert: srvCert, Key: srvKey, CA: ca.CertFile}); err != nil {
		t.Fatal(err)
	}
	if client, err = mtls.Client(mtls.Files{Cert: cliCert, Key: cliKey, CA: ca.CertFile}, "localhost"); err != nil {
		t.Fatal(err)
	}
	return server, client
}

// agentHandler is ra's HTTP API as the agent serve command serves it with
// TLS: /v1/check needs a client certificate.
func agentHandler(ra *runningAgent) http.Handler {
	return mtls.RequireClientCert(ra.a.HTTPHandler(), "/metrics", "/healthz", "/readyz")
}

// tlsAgentHTTP serves ra's HTTP API over TLS (serverTLS) through
// ListenHTTP, with the listener's settings changed by mod, until the end
// of t, and returns its address.
func tlsAgentHTTP(t testing.TB, ra *runningAgent, serverTLS *tls.Config, mod func(*checkapi.HTTPListener)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc := checkapi.DefaultHTTPListener(serverTLS, checkapi.DefaultMaxHTTPConns)
	if mod != nil {
		mod(&lc)
	}
	srv, hl, err := ra.a.ListenHTTP(l, agentHandler(ra), lc)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(hl)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// certClient is an HTTPS client presenting clientTLS's certificate;
// keepAlive false makes a new connection for every request.
func certClient(t testing.TB, clientTLS *tls.Config, keepAlive bool) *http.Client {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS, ForceAttemptHTTP2: true, DisableKeepAlives: !keepAlive}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// holdIdle opens n TCP connections to addr that send nothing, spread over
// the loopback sources 127.0.2.1 onward, perSource from each; they are
// closed at the end of t.
func holdIdle(t testing.TB, addr string, n, perSource int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(1+i/perSource))}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	return conns
}

func checkOverHTTP(t testing.TB, client *http.Client, addr string) {
	t.Helper()
	resp, err := client.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"policy":"api","attributes":{"tenant":"good"}}`))
	if err != nil {
		t.Fatalf("a good client's check: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a good client's check: %d %s", resp.StatusCode, body)
	}
}

// More connections that never handshake than the agent allows pending
// (from one source and from 40) are closed, the oldest first, and counted
// by reason; a client with a certificate is answered throughout, on new
// connections; the handshake failures are a few log lines through the
// agent's logger, none in net/http's own format; a stalled handshake is
// closed at its deadline.
func TestHTTPListenerHoldsUnderIdleHandshakes(t *testing.T) {
	var logs testenv.SyncBuffer
	ra := regionAgent(t, "name: api\nidentity: [tenant]\nlimit: 100000\nperiod: 1s\nscope: region\n", func(c *Config) {
		c.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &logs})
	})
	stderr := captureStdLog(t)
	serverTLS, clientTLS := agentTLS(t)
	addr := tlsAgentHTTP(t, ra, serverTLS, func(c *checkapi.HTTPListener) {
		c.Handshake.Timeout, c.Handshake.PerSource, c.Handshake.Total = time.Minute, 8, 64
	})
	client := certClient(t, clientTLS, false)
	checkOverHTTP(t, client, addr)
	before := openFDs(t)
	const idle, perSource = 320, 8 // five times the pending cap, from 40 sources
	holdIdle(t, addr, idle, perSource)
	holdIdle(t, addr, 12, 12) // 12 from one source: 4 past its cap
	fails := func(reason string) float64 {
		return counterValueLabeled(t, ra.a, "quotalease_agent_http_handshake_failures_total", "reason", reason)
	}
	testenv.WaitFor(t, 10*time.Second, "the idle connections past the caps closed", func() bool {
		return fails(handshake.ReasonEvicted) >= idle+12-64-4 && fails(handshake.ReasonSourceLimit) >= 4
	})
	for i := 0; i < 5; i++ { // each check on a new connection, handshaking among the idle ones
		checkOverHTTP(t, client, addr)
	}
	// The idle connections' own descriptors (on this, the client side),
	// at most 64 pending on the agent's side, and a few more (the good
	// client's, the runtime's).
	if grown := openFDs(t) - before; grown > idle+12+64+16 {
		t.Fatalf("descriptors grew by %d holding %d idle connections", grown, idle+12)
	}
	out := logs.String()
	if n := strings.Count(out, "HTTP connection closed before its handshake completed"); n < 1 || n > 4 {
		t.Fatalf("%d log lines for %v failed handshakes, want one or two per reason:\n%s", n, fails(handshake.ReasonEvicted)+fails(handshake.ReasonSourceLimit), out)
	}
	if strings.Contains(stderr.String(), "TLS handshake error") {
		t.Fatalf("net/http logged handshake errors on its own:\n%s", stderr.String())
	}

	// A stalled handshake is closed at the deadline.
	addr = tlsAgentHTTP(t, ra, serverTLS, func(c *checkapi.HTTPListener) { c.Handshake.Timeout = 200 * time.Millisecond })
	stalled := holdIdle(t, addr, 1, 1)[0]
	timeouts := fails(handshake.ReasonTimeout)
	stalled.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, stalled); err != nil {
		t.Fatalf("a stalled handshake was not closed within 10 s of its 200 ms deadline: %v", err)
	}
	testenv.WaitFor(t, 5*time.Second, "the timeout counted", func() bool { return fails(handshake.ReasonTimeout) == timeouts+1 })
}

// captureStdLog sends the standard logger's output (where net/http logs
// without an ErrorLog) to a buffer for the rest of t.
func captureStdLog(t testing.TB) *testenv.SyncBuffer {
	var b testenv.SyncBuffer
	prev := log.Writer()
	log.SetOutput(&b)
	t.Cleanup(func() { log.SetOutput(prev) })
	return &b
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}
