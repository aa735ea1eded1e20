package checkapi

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"

	"golang.org/x/net/netutil"

	"github.com/quota-lease/quota-lease/internal/handshake"
)

// HTTPListener is how the agent's HTTP listener treats connections that
// have not shown they are clients: see ListenHTTP.
type HTTPListener struct {
	// TLS is the listener's server configuration; nil: plaintext.
	TLS *tls.Config
	// MaxConns bounds open connections, pending or not (beyond it new ones
	// wait in the kernel's backlog).
	MaxConns int
	// Handshake bounds pending connections: the deadline, per source and
	// in total (TLS and Failed are set by ListenHTTP).
	Handshake handshake.Config
}

// DefaultHTTPListener is TLS as given, at most maxConns connections open,
// and the handshake package's defaults (3 s, 64 pending per source, 1,024
// in all), at most half of maxConns pending, so that handshakes never take
// every slot.
func DefaultHTTPListener(tlsCfg *tls.Config, maxConns int) HTTPListener {
	hc := handshake.DefaultConfig()
	hc.Total = min(hc.Total, max(1, maxConns/2))
	hc.PerSource = min(hc.PerSource, hc.Total)
	return HTTPListener{TLS: tlsCfg, MaxConns: maxConns, Handshake: hc}
}

// Listen makes l the agent's HTTP listener and returns the server to
// run on it with Serve (never ServeTLS: the listener has done the
// handshake). Without it 600 connections that trickled a TLS handshake or
// sent nothing held every connection slot: net/http handshakes in the
// connection's own goroutine, after accepting it. Here a connection
// reaches the server only once its handshake is done (or, in plaintext,
// its first byte came) within the deadline, and connections still pending
// are bounded per source address (new ones past it are closed) and in all
// (the oldest is closed): handshake.Listener. Open connections are at most
// MaxConns. Failed handshakes are counted
// (quotalease_agent_http_handshake_failures_total{reason}) and logged
// through the agent's logger, paced: a line per reason and interval, with
// the count left out. So are the server's own error lines
// (http.Server.ErrorLog). The server's timeouts and header cap are the
// HTTP constants of servercaps.go.
func (s *Server) Listen(l net.Listener, h http.Handler, c HTTPListener) (*http.Server, net.Listener, error) {
	if c.MaxConns < 1 {
		return nil, nil, fmt.Errorf("HTTP listener: max connections %d must be at least 1", c.MaxConns)
	}
	if c.MaxConns <= c.Handshake.Total {
		return nil, nil, fmt.Errorf("HTTP listener: max connections %d must exceed the pending handshakes %d, "+
			"or handshakes could take every slot", c.MaxConns, c.Handshake.Total)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: HTTPReadHeaderTimeout,
		ReadTimeout:       HTTPReadTimeout,
		WriteTimeout:      HTTPWriteTimeout,
		IdleTimeout:       HTTPIdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          s.c.Log.StdLogger(),
	}
	hc := c.Handshake
	if c.TLS != nil {
		// As ServeTLS would: HTTP/2 and HTTP/1.1 offered; the server
		// serves HTTP/2 on the connections that chose it when its
		// TLSConfig offers "h2".
		hc.TLS = c.TLS.Clone()
		for _, p := range []string{"h2", "http/1.1"} {
			if !slices.Contains(hc.TLS.NextProtos, p) {
				hc.TLS.NextProtos = append(hc.TLS.NextProtos, p)
			}
		}
		srv.TLSConfig = hc.TLS
	}
	hc.Failed = s.handshakeFailed
	hl, err := handshake.New(netutil.LimitListener(l, c.MaxConns), hc)
	if err != nil {
		return nil, nil, fmt.Errorf("HTTP listener: %w", err)
	}
	return srv, hl, nil
}

// handshakeFailed counts and logs (paced) a connection that did not pass
// the HTTP listener's handshake.
func (s *Server) handshakeFailed(reason string, remote net.Addr, err error) {
	s.c.HandshakeFailures.WithLabelValues(reason).Inc()
	s.c.Log.Warn("handshake-"+reason,
		"HTTP connection closed before its handshake completed", "reason", reason, "remote", remote.String(), "error", err)
}
