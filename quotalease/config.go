package quotalease

import (
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/edge/envoy"
)

// ClientMetadata is the stream metadata key by which the client library
// names itself to the agent; its value is "go".
const ClientMetadata = "x-quota-lease-client"

// Defaults of a Config's zero fields.
const (
	// DefaultReportInterval is how often a client reports its buckets'
	// usage. Envoy hard-codes 5 s; a shorter period lets the agent follow
	// demand sooner at the cost of one small message a period.
	DefaultReportInterval = time.Second
	// DefaultReconnect is the first wait before a closed stream is opened
	// again; it doubles on each refused or failed attempt up to the report interval.
	DefaultReconnect = 100 * time.Millisecond
	// DefaultForgetAfter is how long a bucket may go without a request
	// before the client forgets it and stops reporting it.
	DefaultForgetAfter = 5 * time.Minute
	// DefaultSendQueue is how many reports may wait for a stream to open.
	DefaultSendQueue = 1024
	// Keepalive is how often an idle connection to an agent is pinged;
	// one unanswered for half as long is closed and the stream reopened
	// on the next agent.
	Keepalive = 10 * time.Second
	// ConnectTimeout bounds one attempt to connect to an agent.
	ConnectTimeout = 5 * time.Second
)

// Config configures a Client. Domain and one of Agents or Target are
// required; every other zero field takes its default.
type Config struct {
	// Agents are the region's agents' RLQS addresses (host:port), tried
	// in order: the client streams to the first that answers and fails
	// over to the next, as Envoy does across the hosts of a cluster. With
	// TLS, each agent's certificate is checked against its host name.
	Agents []string
	// Target is a gRPC target instead of Agents, for a name a resolver
	// expands (for example "dns:///agents.example:7500").
	Target string
	// DialOptions are passed to grpc.NewClient: at least the transport
	// credentials (the agent's mTLS, with the certificate of a service).
	DialOptions []grpc.DialOption
	// Metadata is sent when each stream opens, with ClientMetadata naming
	// the client library (the agent counts library clients apart from
	// Envoys) unless Anonymous.
	Metadata  metadata.MD
	Anonymous bool
	// Domain names the client's buckets to the agent, as the domain of
	// Envoy's filter does: any name but that of an envoyproxy/ratelimit
	// configuration the agents serve, whose buckets are matched to its
	// descriptors (docs/rlqs-server.md).
	Domain string
	// Buckets is what a bucket does while it holds no assignment and after
	// one expires: envoy.SettingsOf(policy.Edge) gives what the policy
	// states, which is what the bound's edge term counts. The zero value
	// allows all until assigned.
	Buckets envoy.Settings

	// ReportInterval is the period of usage reports (DefaultReportInterval).
	ReportInterval time.Duration
	// Reconnect is the wait before reopening a closed stream
	// (DefaultReconnect); after streams the agents refuse, it doubles up
	// to ReportInterval.
	// ReconnectWithReport reopens it only with the next report instead,
	// as Envoy does.
	Reconnect           time.Duration
	ReconnectWithReport bool
	// WholeSeconds reports the time since a bucket's last report in whole
	// seconds, as Envoy does, instead of to the nanosecond (from which the
	// agent reads the bucket's rate exactly, whatever delays the reports).
	WholeSeconds bool
	// ForgetAfter is how long an unused bucket is kept
	// (DefaultForgetAfter); negative keeps every bucket until the agent
	// abandons it, as Envoy does.
	ForgetAfter time.Duration
	// SendQueue bounds the reports waiting for a stream to open; beyond it
	// they are dropped and counted (DefaultSendQueue).
	SendQueue int
	// Clock is read for decisions, token buckets and deadlines (the
	// system clock when nil).
	Clock clock.Clock
}

// withDefaults is c with every zero field that has a default set to it.
func (c Config) withDefaults() Config {
	if c.ReportInterval == 0 {
		c.ReportInterval = DefaultReportInterval
	}
	if c.Reconnect == 0 {
		c.Reconnect = DefaultReconnect
	}
	if c.ForgetAfter == 0 {
		c.ForgetAfter = DefaultForgetAfter
	}
	if c.SendQueue == 0 {
		c.SendQueue = DefaultSendQueue
	}
	if c.Clock == nil {
		c.Clock = clock.System()
	}
	return c
}

// validate reports every bad setting of a Config with its defaults set.
func (c Config) validate() error {
	var errs []error
	switch {
	case len(c.Agents) == 0 && c.Target == "":
		errs = append(errs, errors.New("no agents: set Agents (or Target) to the region's agents' RLQS addresses"))
	case len(c.Agents) > 0 && c.Target != "":
		errs = append(errs, errors.New("both Agents and Target are set; set one"))
	}
	for _, a := range c.Agents {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("agent %q: %v: give each agent as host:port (its --grpc-listen)", a, err))
		}
	}
	if c.Domain == "" {
		errs = append(errs, errors.New("domain is empty: set it to the agent's RLQS domain"))
	}
	if c.ReportInterval < 0 {
		errs = append(errs, fmt.Errorf("report interval %v is negative", c.ReportInterval))
	}
	if c.Reconnect < 0 {
		errs = append(errs, fmt.Errorf("reconnect wait %v is negative", c.Reconnect))
	}
	if c.SendQueue < 0 {
		errs = append(errs, fmt.Errorf("send queue %d is negative", c.SendQueue))
	}
	if c.Buckets.NoAssignment.Kind == envoy.TokenBucket {
		errs = append(errs, errors.New("a token bucket cannot be the no-assignment behaviour (Envoy crashes on it): "+
			"use a blanket rule there and a token bucket as the expired fallback"))
	}
	return errors.Join(errs...)
}
