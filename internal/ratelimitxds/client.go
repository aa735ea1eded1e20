// Package ratelimitxds subscribes to an xDS management server for
// envoyproxy/ratelimit's configuration, as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW (src/provider/xds_grpc_sotw_provider.go): one
// aggregated (ADS) state-of-the-world stream of RateLimitConfig resources,
// each response the whole configuration, acknowledged once applied and
// refused (NACKed, with the reason) when it cannot be. The coordinator's
// leader runs it and stores what it receives as policies (docs/envoy.md,
// "Configuration over xDS").
package ratelimitxds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Settings say where the management server is and how to reach it.
type Settings struct {
	// Server is the management server's host:port.
	Server string
	// NodeID is the node the client says it is; a management server keys
	// what it serves by it (Envoy Gateway serves the rate limit
	// configuration to "envoy-ratelimit").
	NodeID string
	// NodeCluster, when set, is the node's cluster.
	NodeCluster string
	// TLS, when set, secures the connection (the client certificate in it
	// is presented); nil connects in plaintext.
	TLS *tls.Config
	// MaxMessageBytes bounds one response. Default 16 MiB.
	MaxMessageBytes int
	// MinBackoff and MaxBackoff bound the wait before reconnecting after
	// the stream ended: it doubles from MinBackoff up to MaxBackoff, with
	// jitter, and starts again from MinBackoff once a stream has delivered
	// a response.
	MinBackoff, MaxBackoff time.Duration
}

// Defaults for Settings.
const (
	DefaultNodeID          = "envoy-ratelimit"
	DefaultMaxMessageBytes = 16 << 20
	DefaultMinBackoff      = 250 * time.Millisecond
	DefaultMaxBackoff      = 30 * time.Second
)

// Validate reports every setting that cannot work.
func (s Settings) Validate() error {
	var errs []error
	if s.Server == "" {
		errs = append(errs, errors.New("xDS server address is empty"))
	}
	if s.NodeID == "" {
		errs = append(errs, errors.New("xDS node id is empty"))
	}
	if s.MaxMessageBytes <= 0 {
		errs = append(errs, fmt.Errorf("xDS max message size %d must be positive", s.MaxMessageBytes))
	}
	if s.MinBackoff <= 0 || s.MaxBackoff < s.MinBackoff {
		errs = append(errs, fmt.Errorf("xDS backoff %s to %s: the least must be positive and at most the most",
			s.MinBackoff, s.MaxBackoff))
	}
	return errors.Join(errs...)
}

// Applier stores a converted response. An error marked with Reject makes
// the client NACK the response; any other error is taken as passing, and
// the client reconnects to be sent the whole state again.
type Applier func(ctx context.Context, c Config) error

// Client is a subscription to one management server.
type Client struct {
	s       Settings
	apply   Applier
	log     hclog.Logger
	metrics *Metrics
}

// NewClient returns a client of s that hands every response to apply;
// metrics may be nil.
func NewClient(s Settings, apply Applier, log hclog.Logger, metrics *Metrics) (*Client, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if metrics == nil {
		metrics = NewMetrics()
	}
	return &Client{s: s, apply: apply, log: log, metrics: metrics}, nil
}

// Run subscribes until ctx ends, reconnecting with backoff whenever the
// stream ends. Nothing is undone when the server goes away: what was last
// applied stays until a response replaces it.
func (c *Client) Run(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if c.s.TLS != nil {
		creds = credentials.NewTLS(c.s.TLS)
	}
	cc, err := grpc.NewClient(c.s.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.s.MaxMessageBytes)))
	if err != nil {
		return fmt.Errorf("xDS server %s: %w", c.s.Server, err)
	}
	defer cc.Close()
	wait := c.s.MinBackoff
	for ctx.Err() == nil {
		got, err := c.stream(ctx, cc)
		if ctx.Err() != nil {
			break
		}
		if got {
			wait = c.s.MinBackoff
		}
		c.log.Warn("xDS stream ended; reconnecting", "server", c.s.Server, "error", err, "in", wait)
		select {
		case <-ctx.Done():
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, c.s.MaxBackoff)
	}
	return nil
}

// stream runs one ADS stream until it fails or ctx ends; got reports
// whether it delivered a response.
func (c *Client) stream(ctx context.Context, cc grpc.ClientConnInterface) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.metrics.connects.Inc()
	st, err := discovery.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: c.s.NodeID, Cluster: c.s.NodeCluster}
	// A new stream asks for the whole state (no version): a restarted
	// server may reuse version strings, and what is stored is compared
	// with what arrives, so an unchanged state writes nothing.
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL}); err != nil {
		return false, err
	}
	defer c.metrics.setConnected(false)
	acked := ""
	nacks := nackPacer{min: c.s.MinBackoff, max: c.s.MaxBackoff}
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		if !got {
			got = true
			c.metrics.setConnected(true)
			c.log.Info("xDS stream open", "server", c.s.Server, "node", c.s.NodeID)
		}
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce(), VersionInfo: acked}
		err = c.handle(ctx, resp)
		switch {
		case err == nil:
			acked = resp.GetVersionInfo()
			req.VersionInfo = acked
			c.metrics.responses.WithLabelValues("applied").Inc()
			c.metrics.setApplied(acked)
			nacks.reset()
		case IsRejection(err):
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			c.metrics.responses.WithLabelValues("rejected").Inc()
			wait, repeated := nacks.rejected(err.Error())
			if repeated == 0 {
				c.log.Warn("xDS response rejected (NACK); the last applied configuration stays",
					"version", resp.GetVersionInfo(), "applied", acked, "error", err)
			} else if repeated&(repeated-1) == 0 { // the 1st, 2nd, 4th, 8th ... repetition
				c.log.Warn("xDS server keeps sending a configuration that was rejected; NACKs are paced",
					"version", resp.GetVersionInfo(), "times", repeated+1, "next_nack_in", wait, "error", err)
			}
			select {
			case <-ctx.Done():
				return got, ctx.Err()
			case <-time.After(wait):
			}
		default:
			c.metrics.responses.WithLabelValues("failed").Inc()
			return got, fmt.Errorf("apply version %q: %w", resp.GetVersionInfo(), err)
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// nackPacer paces the NACKs of one stream: a server that answers every
// NACK by sending the rejected configuration again would otherwise loop
// as fast as both can convert (tens of thousands a minute, each logged).
// The first NACK goes at once; while rejections follow one another each
// waits twice as long as the one before, from min up to max. An applied
// response starts it again.
type nackPacer struct {
	min, max time.Duration
	wait     time.Duration // before the next NACK
	last     string        // the last rejection's error
	repeated int           // how many rejections in a row gave it
}

// rejected records a rejection with error msg and returns how long to wait
// before NACKing it, and how many times in a row before it msg was given
// (0: a new error, to be logged).
func (p *nackPacer) rejected(msg string) (wait time.Duration, repeated int) {
	if msg == p.last {
		p.repeated++
	} else {
		p.last, p.repeated = msg, 0
	}
	wait = p.wait
	p.wait = min(max(2*p.wait, p.min), p.max)
	return wait, p.repeated
}

func (p *nackPacer) reset() { p.wait, p.last, p.repeated = 0, "", 0 }

// handle converts and applies one response.
func (c *Client) handle(ctx context.Context, resp *discovery.DiscoveryResponse) error {
	c.metrics.responses.WithLabelValues("received").Inc()
	c.log.Debug("xDS response received", "version", resp.GetVersionInfo(), "resources", len(resp.GetResources()))
	if resp.GetTypeUrl() != TypeURL {
		return Reject(fmt.Errorf("response of type %q; this client subscribes to %s only", resp.GetTypeUrl(), TypeURL))
	}
	cfg, err := Convert(resp.GetVersionInfo(), resp.GetResources())
	if err != nil {
		return Reject(err)
	}
	return c.apply(ctx, cfg)
}
