// Package etcdembed runs a single-node etcd inside the process: the
// coordinator's zero-setup default for a laptop or a demo, and the etcd of
// the tests. Production uses an external etcd cluster instead.
package etcdembed

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is a running embedded etcd.
type Server struct {
	// Endpoint is the client URL, e.g. http://127.0.0.1:2379.
	Endpoint string
	e        *embed.Etcd
}

// Config says where the embedded etcd keeps its data and listens.
type Config struct {
	// Dir holds the data; reused across restarts.
	Dir string
	// ClientAddr is host:port for clients; "127.0.0.1:0" picks a free port.
	ClientAddr string
	// LogLevel of etcd's own log, written to Dir/etcd.log. Default "warn".
	LogLevel string
	// CertFile and KeyFile, when set, make the client listener TLS (https);
	// ClientCAFile then also requires client certificates. Tests of the
	// coordinator's etcd TLS use them.
	CertFile, KeyFile, ClientCAFile string
	// QuotaBackendBytes is the size etcd's database may reach before etcd
	// raises its NOSPACE alarm and stores nothing more. 0: etcd's default,
	// 2 GiB. The coordinator compacts the history that fills it.
	QuotaBackendBytes int64
}

// Start runs etcd and waits until it serves, or ctx ends.
func Start(ctx context.Context, c Config) (*Server, error) {
	if c.ClientAddr == "" {
		c.ClientAddr = "127.0.0.1:0"
	}
	if c.LogLevel == "" {
		c.LogLevel = "warn"
	}
	cfg := embed.NewConfig()
	cfg.Name = "quota-lease"
	cfg.Dir = c.Dir
	scheme := "http"
	if c.CertFile != "" {
		scheme = "https"
		cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = c.CertFile, c.KeyFile
		if c.ClientCAFile != "" {
			cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = c.ClientCAFile, true
		}
	}
	client, err := url.Parse(scheme + "://" + c.ClientAddr)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client address %q: %w", c.ClientAddr, err)
	}
	peer, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.LogLevel = c.LogLevel
	cfg.QuotaBackendBytes = c.QuotaBackendBytes
	cfg.LogOutputs = []string{filepath.Join(c.Dir, "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", c.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded etcd did not become ready: %w", ctx.Err())
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd did not become ready within 60s; see %s", cfg.LogOutputs[0])
	}
	return &Server{Endpoint: scheme + "://" + e.Clients[0].Addr().String(), e: e}, nil
}

// Close stops etcd and waits for it.
func (s *Server) Close() { s.e.Close() }

// StartTemp runs etcd in a fresh temporary directory, for tests: stop
// closes it and removes the directory.
func StartTemp(ctx context.Context) (s *Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "quota-lease-etcd-")
	if err != nil {
		return nil, nil, err
	}
	s, err = Start(ctx, Config{Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return s, func() { s.Close(); os.RemoveAll(dir) }, nil
}
