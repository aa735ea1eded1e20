// Package leaseapi is the lease protocol on the wire, shared by the
// coordinator and the agents: the client an agent renews its leases with
// (Client: it follows the leader's hints, skips replicas that hang, and
// pins the cluster ID), the encoding and decoding of grants (EncodeGrant,
// DecodeGrant), the error codes both sides agree on, and the limits a
// request must stay within.
package leaseapi
