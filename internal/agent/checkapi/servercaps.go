package checkapi

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
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
	// wait to be accepted, so slow clients cannot exhaust descriptors. Up
	// to half of them may be connections still handshaking (ListenHTTP).
	DefaultMaxHTTPConns = 2048
	// HTTP timeouts: a request's headers must arrive within
	// HTTPReadHeaderTimeout (on a new connection, once its handshake is
	// done: ListenHTTP bounds that), the whole request within
	// HTTPReadTimeout, its answer leave within HTTPWriteTimeout; a
	// keep-alive connection idle for HTTPIdleTimeout is closed.
	HTTPReadHeaderTimeout = 2 * time.Second
	HTTPReadTimeout       = 5 * time.Second
	HTTPWriteTimeout      = 10 * time.Second
	HTTPIdleTimeout       = time.Minute
	// MaxHeaderBytes bounds a request's headers: a check needs a few
	// hundred bytes, and a bearer token some kilobytes.
	MaxHeaderBytes = 16 << 10
	// KeepaliveMinPing is the shortest interval between a client's HTTP/2
	// pings the gRPC server accepts, with or without a call in flight.
	// Envoy's connection_keepalive (docs/rlqs.md recommends 5 s, and Envoy
	// adds up to 15% jitter) pings an RLQS stream the agent may not write
	// to for minutes; grpc-go's default would answer the third such ping
	// with GOAWAY "too_many_pings" and cut the stream.
	KeepaliveMinPing = 2 * time.Second
	// KeepaliveIdle and KeepaliveTimeout: a connection silent for
	// KeepaliveIdle is pinged, and closed if the ping is not answered
	// within KeepaliveTimeout, so a vanished Envoy's streams (and the edge
	// instance places they hold) are freed in under a minute, not the two
	// hours of grpc-go's default.
	KeepaliveIdle    = 30 * time.Second
	KeepaliveTimeout = 10 * time.Second
)

// GRPCServerOptions are the resource caps of an agent's gRPC server; add
// the credentials.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvBytes),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinPing, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveIdle, Timeout: KeepaliveTimeout}),
	}
}
