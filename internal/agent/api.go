package agent

import (
	"net"
	"net/http"

	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
)

// The agent's APIs are the check APIs (package checkapi: HTTP, gRPC,
// Envoy's RateLimitService), which translate into its admission pipeline,
// and Envoy's Rate Limit Quota Service (package rlqs), which streams to its
// edge engine.

// HTTPHandler returns the agent's HTTP API (checkapi.Server.Handler).
func (a *Agent) HTTPHandler() http.Handler { return a.api.Handler() }

// ListenHTTP makes l the agent's HTTP listener (checkapi.Server.Listen).
func (a *Agent) ListenHTTP(
	l net.Listener,
	h http.Handler,
	c checkapi.HTTPListener,
) (*http.Server, net.Listener, error) {
	return a.api.Listen(l, h, c)
}

// RegisterGRPC adds the check service, Envoy's rate-limit service and
// Envoy's Rate Limit Quota Service to s.
func (a *Agent) RegisterGRPC(s *grpc.Server) {
	a.api.Register(s)
	a.edge.Register(s)
}

// envoyIndex is the Envoy index of the policies in force; nil until they
// are installed.
func (a *Agent) envoyIndex() checkapi.EnvoyIndex {
	if p := a.envoy.Load(); p != nil {
		return *p
	}
	return nil
}
