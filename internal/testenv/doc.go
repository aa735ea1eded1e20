// Package testenv is the test and demo scaffolding, apart from the
// product.
//
// This package holds what the tests of several packages share: an embedded
// etcd for a whole test binary, unique etcd key prefixes, waiting for a
// condition, parsing policies that must be valid, the flood of identity
// demands the coordinator's and the end-to-end flood tests send
// (FloodIdentityDemands; so the tests of internal/leaseapi and of the
// proto package cannot import it), and the skips that keep
// `go test -short ./...` fast (every suite that starts real processes for
// more than a moment: the multi-process deployments, the browser). Only
// _test.go files may import it; TestOnlyTestsImport enforces this.
//
// Its sub-packages are cluster (a real multi-process deployment on
// loopback, for the demo and the end-to-end suites), redistest (real
// redis-server, Redis Cluster and Sentinel processes), faultproxy (TCP
// proxies that cut, delay and drop), promnames (metric names in the
// deployment artifacts), rlqsenvoy (Envoy's rate limit quota filter as
// an RLQS client, written from Envoy's source, many instances per
// process), rlqsfake (an RLQS server that records what it receives and
// sends what a test tells it to), edgescript (a script of reports and
// faults that drives the agent's and the simulator's edge rounds alike),
// xdsserver (a real xDS management server serving RateLimitConfig) and
// impostor (a fake coordinator over TLS, for tests that a client accepts
// a coordinator only by its identity). No shipped binary links any of it (deploy's tests check); the
// demo is a command of its own, cmd/quota-lease-demo.
package testenv
