package coordinator

import "google.golang.org/grpc"

// Limits of the coordinator's gRPC server: a request holds at most a
// policy file's worth of YAML or a renewal of MaxQuotasPerRequest quotas.
const (
	MaxRecvBytes         = 4 << 20
	MaxConcurrentStreams = 256
)

// ServerOptions are the coordinator's gRPC server options: its limits and
// interceptors (the cluster check, then authorization). Add the
// credentials.
func (c *Coordinator) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvBytes), grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.ChainUnaryInterceptor(c.checkCluster, c.Authorize)}
}
