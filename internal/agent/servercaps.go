package agent

import (
	"time"

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
)

// GRPCServerOptions are the resource caps of an agent's gRPC server; add
// the credentials.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvBytes), grpc.MaxConcurrentStreams(MaxConcurrentStreams)}
}
