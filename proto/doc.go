// Package proto holds the gRPC/protobuf definitions of quota-lease (lease
// protocol, check API, admin API) and their generated Go code, committed.
package proto
