package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/ratelimitxds"
)

// xdsOptions are serve's flags of the xDS subscription to envoyproxy/
// ratelimit's configuration (docs/envoy.md, "Configuration over xDS").
type xdsOptions struct {
	server, node, serverName, serverID string
	tls                                mtls.Files
}

func addXDSFlags(fs *flag.FlagSet) *xdsOptions {
	o := &xdsOptions{}
	fs.StringVar(&o.server, "ratelimit-xds", "",
		"host:port of an xDS management server serving envoyproxy/ratelimit's configuration (RateLimitConfig "+
			"over ADS, as Envoy Gateway serves it): the leader stores what it serves as policies, next to quota "+
			"set (empty: none)")
	fs.StringVar(&o.node, "ratelimit-xds-node-id", ratelimitxds.DefaultNodeID,
		"node id to subscribe as; Envoy Gateway serves the rate limit configuration to envoy-ratelimit")
	fs.StringVar(&o.tls.CA, "ratelimit-xds-tls-ca", "",
		"PEM CA of the management server's certificate; turns TLS 1.3 on toward it")
	fs.StringVar(&o.tls.Cert, "ratelimit-xds-tls-cert", "", "PEM client certificate to present to the management server")
	fs.StringVar(&o.tls.Key, "ratelimit-xds-tls-key", "", "PEM key of --ratelimit-xds-tls-cert")
	fs.StringVar(&o.serverName, "ratelimit-xds-server-name", "",
		"name the management server's certificate must carry (default: the host of --ratelimit-xds)")
	fs.StringVar(&o.serverID, "ratelimit-xds-server-id", "",
		"SPIFFE ID (spiffe://...) or DNS name the management server's certificate must also carry; required "+
			"when --ratelimit-xds-tls-ca is this deployment's CA (--tls-client-ca), which signs every agent and "+
			"service")
	return o
}

// settings are the subscription's settings, nil without --ratelimit-xds. A
// plaintext subscription to a server off loopback needs --insecure: whoever
// answers there would set the limits. With TLS, a server whose CA is the
// deployment's own (deploymentCA, the listeners' client CA) must be pinned
// by --ratelimit-xds-server-id: that CA signs every agent and service,
// any of which could otherwise serve the limits.
func (o *xdsOptions) settings(insecure bool, deploymentCA string, warn func(string)) (*ratelimitxds.Settings, error) {
	if o.server == "" {
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(o.server); err != nil {
		return nil, fmt.Errorf("--ratelimit-xds %s: want host:port: %w", o.server, err)
	}
	s := &ratelimitxds.Settings{Server: o.server, NodeID: o.node, MaxMessageBytes: ratelimitxds.DefaultMaxMessageBytes,
		MinBackoff: ratelimitxds.DefaultMinBackoff, MaxBackoff: ratelimitxds.DefaultMaxBackoff}
	if o.tls.Enabled() {
		tc, err := mtls.Client(o.tls, o.serverName)
		if err != nil {
			return nil, fmt.Errorf("--ratelimit-xds TLS: %w (give --ratelimit-xds-tls-ca, and "+
				"--ratelimit-xds-tls-cert and -key for a client certificate)", err)
		}
		if o.serverID != "" {
			mtls.PinPeer(tc, o.serverID)
		} else if sameFile(o.tls.CA, deploymentCA) {
			return nil, fmt.Errorf("--ratelimit-xds-tls-ca is this deployment's CA (--tls-client-ca), which signs " +
				"every agent and service: name the management server's identity with --ratelimit-xds-server-id (e.g. " +
				"spiffe://<trust domain>/role/xds), or any of them could set the limits")
		}
		s.TLS = tc
		return s, nil
	}
	if o.serverID != "" {
		return nil, fmt.Errorf("--ratelimit-xds-server-id %s needs TLS: give --ratelimit-xds-tls-ca", o.serverID)
	}
	if !mtls.IsLoopback(o.server) {
		if !insecure {
			return nil, fmt.Errorf("--ratelimit-xds %s is not a loopback address, and without TLS whoever answers "+
				"there sets the limits: give --ratelimit-xds-tls-ca (and a client certificate), or pass --insecure", o.server)
		}
		warn(fmt.Sprintf("--ratelimit-xds %s without TLS: whoever answers there sets the limits", o.server))
	}
	return s, nil
}

// sameFile reports whether files a and b both exist with the same
// contents.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}

// xdsServer is the management server s subscribes to, "" for none.
func xdsServer(s *ratelimitxds.Settings) string {
	if s == nil {
		return ""
	}
	return s.Server
}
