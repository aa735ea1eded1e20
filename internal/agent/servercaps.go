package agent

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
)

// The agent's server resource caps (not rate limits: those are the
// policies'): what one caller may hold of an agent, so that no caller can
// hurt the others. Every listener is bounded in message size, streams,
// time and connections. The gRPC messages buffered at once are at most
// MaxConcurrentStreams × MaxRecvBytes per connection; a check is a few
// hundred bytes and a batch of MaxBatch small checks fits.
const (
	// MaxRecvBytes bounds one gRPC request (the default would be 4 MiB).
	MaxRecvBytes = 256 << 10
	// MaxConcurrentStreams bounds the calls in flight on one connection.
	MaxConcurrentStreams = 256
	// DefaultMaxHTTPConns bounds open HTTP connections: beyond it new ones
	// wait to be accepted, so slow clients cannot exhaust descriptors.
	DefaultMaxHTTPConns = 512
	// HTTP timeouts: a request's headers and body must arrive within
	// HTTPReadTimeout, its answer leave within HTTPWriteTimeout.
	HTTPReadTimeout  = 5 * time.Second
	HTTPWriteTimeout = 10 * time.Second
	HTTPIdleTimeout  = 2 * time.Minute
	MaxHeaderBytes   = 64 << 10
)

// GRPCServerOptions are the resource caps of an agent's gRPC server; add
// the credentials.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvBytes), grpc.MaxConcurrentStreams(MaxConcurrentStreams)}
}

// NewHTTPServer returns the agent's HTTP server for h with its timeouts
// and header cap; tlsCfg may be nil (plaintext).
func NewHTTPServer(h http.Handler, tlsCfg *tls.Config) *http.Server {
	return &http.Server{Handler: h, TLSConfig: tlsCfg, ReadHeaderTimeout: HTTPReadTimeout, ReadTimeout: HTTPReadTimeout,
		WriteTimeout: HTTPWriteTimeout, IdleTimeout: HTTPIdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// CapConns caps l at n open connections (DefaultMaxHTTPConns when
// n <= 0).
func CapConns(l net.Listener, n int) net.Listener {
	if n <= 0 {
		n = DefaultMaxHTTPConns
	}
	return netutil.LimitListener(l, n)
}
