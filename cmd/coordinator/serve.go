package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/internal/console"
	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/internal/envflag"
	"github.com/quota-lease/quota-lease/internal/etcdembed"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/version"
	"github.com/quota-lease/quota-lease/lease"
)

const serveDescription = `Runs one coordinator replica. Replicas sharing an etcd elect one leader; the
leader grants leases, followers refuse lease calls naming the leader.

By default (--etcd embedded) the replica starts a single-node etcd inside the
process with its data in --data-dir: nothing else is needed on a laptop. Its
client address is --etcd-listen; other replicas join by pointing
--etcd-endpoints at it. In production point every replica at an etcd cluster
with --etcd-endpoints (implies --etcd external).

On SIGINT or SIGTERM the replica stops granting, resigns leadership (a
follower takes over at once), finishes in-flight calls and exits.

Every flag can also be set from the environment (--tls-cert from
QUOTALEASE_TLS_CERT, and so on) and from a YAML file (--config FILE, keys
the flag names: "etcd-endpoints: [https://etcd-1:2379]", see
deploy/config/coordinator.yaml); the command line wins over the environment,
which wins over the file.`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", "[flags]", serveDescription, stderr)
	listen := fs.String("listen", "127.0.0.1:7400", "gRPC address to serve the lease and admin APIs on")
	httpListen := fs.String("http-listen", "", "HTTP address for the web console, /metrics, /healthz and /readyz (empty: none), e.g. 127.0.0.1:7401")
	cons := console.DefaultConfig()
	withConsole := fs.Bool("console", true, "serve the read-only web console at / on --http-listen (with mutual TLS: to role viewer or admin only)")
	fs.DurationVar(&cons.SampleEvery, "console-sample", cons.SampleEvery, "how often the console records every quota's shares and modes for its charts")
	fs.DurationVar(&cons.Keep, "console-history", cons.Keep, "how much chart history the console keeps in memory (about 40 bytes per region, quota and sample)")
	fs.DurationVar(&cons.Refresh, "console-refresh", cons.Refresh, "how often an open console page updates itself")
	advertise := fs.String("advertise", "", "address agents and other replicas reach this replica at (default: --listen)")
	name := fs.String("name", "", "replica name in logs (default: host name and port)")
	etcdMode := fs.String("etcd", "embedded", "embedded: run etcd in this process; external: use --etcd-endpoints")
	dataDir := fs.String("data-dir", "coordinator-data", "embedded etcd's data directory")
	etcdListen := fs.String("etcd-listen", "127.0.0.1:0", "embedded etcd's client address (host:port; port 0 picks one)")
	endpoints := fs.String("etcd-endpoints", "", "external etcd endpoints, comma-separated (implies --etcd external)")
	prefix := fs.String("prefix", coordinator.DefaultPrefix, "etcd key prefix for all coordinator state")
	regions := fs.String("regions", "", "regions to declare on first start, comma-separated (later: 'regions set-weight')")
	leaseDur := fs.Duration("lease-duration", lease.DefaultTiming.ValidFor, "how long a grant holds")
	drift := fs.Float64("drift", lease.DefaultTiming.Drift, "bound on any clock's rate error (e.g. 1e-4)")
	margin := fs.Duration("lease-margin", lease.DefaultTiming.Margin, "agents stop trusting a grant this much early, on top of drift")
	degraded := fs.Duration("degraded-timeout", lease.DefaultTiming.DegradedTimeout, "how long a lapsed region's degraded budget stays reserved (and usable by it)")
	ttl := fs.Duration("session-ttl", coordinator.DefaultSessionTTL, "etcd leadership session TTL; failover takes about this long")
	rebal := fs.Duration("rebalance-interval", coordinator.DefaultRebalanceInterval, "how often shares are recomputed")
	flushEvery := fs.Duration("flush-interval", coordinator.DefaultFlushInterval, "how often lowered ledger marks are written to etcd")
	strategy := fs.String("strategy", string(allocation.StrategyMaxMinFair), "allocation strategy: static, demand or max-min-fair")
	maxStep := fs.Float64("max-step", coordinator.DefaultMaxStep, "most a share moves per rebalancing round, as a fraction of the quota")
	hysteresis := fs.Float64("hysteresis", coordinator.DefaultHysteresis, "share changes smaller than this fraction of the quota are not made")
	storeLag := fs.Duration("store-lag", 0, "most recent writes a region's Redis may lose when it fails over to a replica (its replication lag); enters the published bound as the store-lag term. 0 where Redis does not fail over to replicas")
	leaseRate := fs.Float64("lease-call-rate", coordinator.DefaultLeaseCallRate, "most Lease calls per second one region's certificate may make (burst twice that); more are refused before they touch the ledger. An agent instance renews about every third of a lease")
	etcdAuth := addEtcdAccessFlags(fs)
	tlsFiles := mtls.ServerFlags(fs)
	trustDomain := fs.String("trust-domain", "quota-lease", "SPIFFE trust domain of the identities in client certificates (spiffe://<domain>/region/<r>, /role/admin, /role/viewer)")
	insecureListen := fs.Bool("insecure", false, "allow listening on a non-loopback address without mutual TLS (anyone who reaches it can lease and administer)")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines instead of text")
	envflag.AddConfigFlag(fs)
	if err := envflag.Preset(fs, args); err != nil {
		return err
	}
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *withConsole {
		if err := cons.Validate(); err != nil {
			return fmt.Errorf("%w (see --console-sample, --console-history, --console-refresh)", err)
		}
	}
	if *advertise == "" {
		*advertise = *listen
	}
	if *name == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(*listen)
		*name = host + ":" + port
	}
	log, err := logs.New("coordinator", *logLevel, *logJSON, stderr)
	if err != nil {
		return err
	}
	log.Info("starting", "build", version.Get().String())
	if *etcdMode == "embedded" && *endpoints == "" && !mtls.IsLoopback(*etcdListen) {
		return fmt.Errorf("--etcd-listen %s: the embedded etcd has no TLS or auth and listens on loopback only; for a cluster reachable from the network run an external etcd (--etcd-endpoints)", *etcdListen)
	}
	tl, err := mtls.SetUp(*tlsFiles, map[string]string{"--listen": *listen, "--http-listen": *httpListen}, *insecureListen, func(w string) { log.Warn(w) })
	if err != nil {
		return err
	}
	domain := ""
	if tl.Mutual {
		domain = *trustDomain
	}
	if *endpoints != "" {
		*etcdMode = "external"
	}

	var eps []string
	switch *etcdMode {
	case "embedded":
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		e, err := etcdembed.Start(ctx, etcdembed.Config{Dir: *dataDir, ClientAddr: *etcdListen})
		if err != nil {
			return err
		}
		defer e.Close()
		abs, _ := filepath.Abs(*dataDir)
		log.Info("embedded etcd ready", "endpoint", e.Endpoint, "data_dir", abs)
		eps = []string{e.Endpoint}
	case "external":
		if *endpoints == "" {
			return fmt.Errorf("--etcd external needs --etcd-endpoints")
		}
		eps = strings.Split(*endpoints, ",")
	default:
		return fmt.Errorf("--etcd must be embedded or external, got %q", *etcdMode)
	}
	ecfg, err := etcdAuth.config(eps)
	if err != nil {
		return err
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()

	var regionList []string
	if *regions != "" {
		regionList = strings.Split(*regions, ",")
	}
	cfg := coordinator.DefaultConfig()
	cfg.Name, cfg.Advertise, cfg.Prefix, cfg.Regions = *name, *advertise, *prefix, regionList
	cfg.Timing = lease.Timing{ValidFor: *leaseDur, Drift: *drift, Margin: *margin, DegradedTimeout: *degraded}
	cfg.SessionTTL, cfg.RebalanceInterval, cfg.FlushInterval = *ttl, *rebal, *flushEvery
	cfg.Strategy, cfg.MaxStep, cfg.Hysteresis = allocation.Strategy(*strategy), *maxStep, *hysteresis
	cfg.StoreLag, cfg.TrustDomain, cfg.LeaseCallRate, cfg.Logger = *storeLag, domain, *leaseRate, log
	c, err := coordinator.New(cli, cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another replica using it? pick another with --listen)", *listen, err)
	}
	opts := c.ServerOptions()
	if tl.GRPC != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tl.GRPC)))
	}
	srv := grpc.NewServer(opts...)
	c.Register(srv)
	go srv.Serve(lis)
	var hsrv *http.Server
	if *httpListen != "" {
		hl, err := net.Listen("tcp", *httpListen)
		if err != nil {
			return fmt.Errorf("listen on %s: %w (choose another with --http-listen)", *httpListen, err)
		}
		var ch http.Handler
		if *withConsole {
			cons.Logger = log.Named("console")
			con, err := console.New(c, cons)
			if err != nil {
				return err
			}
			go con.Run(ctx)
			ch = con
		}
		hsrv = &http.Server{Handler: c.HTTPHandler(ch), TLSConfig: tl.HTTP, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
			WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
		if tl.HTTP != nil {
			go hsrv.ServeTLS(hl, "", "")
		} else {
			go hsrv.Serve(hl)
		}
		defer hsrv.Close()
	}
	log.Info("serving", "listen", lis.Addr().String(), "advertise", *advertise, "etcd", strings.Join(eps, ","),
		"tls", tl.GRPC != nil, "authorization", domain != "")

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(runCtx); close(done) }()
	<-ctx.Done()
	log.Info("shutting down: stepping down and draining")
	stop()
	<-done
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	log.Info("stopped")
	return nil
}
