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

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/allocation"
	"github.com/quota-lease/quota-lease/internal/cli"
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

// runServe runs the serve command: flags, then the configuration they
// make, then the replica.
func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	o, err := serveFlags(args, stderr)
	if err != nil {
		return err
	}
	cfg, err := o.config(stderr)
	if err != nil {
		return err
	}
	return serve(ctx, cfg)
}

// serveOptions are serve's flags as given (or preset from the environment
// and --config).
type serveOptions struct {
	listen, httpListen, advertise, name                      string
	debugListen                                              string
	withConsole                                              bool
	console                                                  console.Config
	etcdMode, dataDir, etcdListen                            string
	endpoints, prefix, regions, strategy                     string
	timing                                                   lease.Timing
	sessionTTL, rebalance, flush, compaction, lag, clockStep time.Duration
	etcdTimeout                                              time.Duration
	maxStep, hysteresis, leaseRate                           float64
	etcdAccess                                               *etcdAccess
	tls                                                      *mtls.Files
	xds                                                      *xdsOptions
	trustDomain, logLevel                                    string
	insecure, logJSON                                        bool
}

// serveFlags defines serve's flags and parses args over the environment
// and --config.
func serveFlags(args []string, stderr io.Writer) (*serveOptions, error) {
	o := &serveOptions{console: console.DefaultConfig()}
	fs := newFlags("serve", "[flags]", serveDescription, stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7400", "gRPC address to serve the lease and admin APIs on")
	fs.StringVar(&o.httpListen, "http-listen", "",
		"HTTP address for the web console, /metrics, /healthz and /readyz (empty: none), e.g. 127.0.0.1:7401")
	fs.StringVar(&o.debugListen, "debug-listen", "", cli.DebugFlagHelp)
	fs.BoolVar(&o.withConsole, "console", true,
		"serve the read-only web console at / on --http-listen (with mutual TLS: to role viewer or admin only)")
	fs.DurationVar(&o.console.SampleEvery, "console-sample", o.console.SampleEvery,
		"how often the console records every quota's shares and modes for its charts")
	fs.DurationVar(&o.console.Keep, "console-history", o.console.Keep,
		"how much chart history the console keeps in memory (about 40 bytes per region, quota and sample)")
	fs.DurationVar(&o.console.Refresh, "console-refresh", o.console.Refresh,
		"how often an open console page updates itself")
	fs.StringVar(&o.advertise, "advertise", "",
		"address agents and other replicas reach this replica at (default: --listen)")
	fs.StringVar(&o.name, "name", "", "replica name in logs (default: host name and port)")
	fs.StringVar(&o.etcdMode, "etcd", "embedded", "embedded: run etcd in this process; external: use --etcd-endpoints")
	fs.StringVar(&o.dataDir, "data-dir", "coordinator-data", "embedded etcd's data directory")
	fs.StringVar(&o.etcdListen, "etcd-listen", "127.0.0.1:0",
		"embedded etcd's client address (host:port; port 0 picks one)")
	fs.StringVar(&o.endpoints, "etcd-endpoints", "", "external etcd endpoints, comma-separated (implies --etcd external)")
	fs.StringVar(&o.prefix, "prefix", coordinator.DefaultPrefix, "etcd key prefix for all coordinator state")
	fs.StringVar(&o.regions, "regions", "",
		"regions to declare on first start, comma-separated (later: 'regions set-weight')")
	fs.DurationVar(&o.timing.ValidFor, "lease-duration", lease.DefaultTiming.ValidFor, "how long a grant holds")
	fs.Float64Var(&o.timing.Drift, "drift", lease.DefaultTiming.Drift, "bound on any clock's rate error (e.g. 1e-4)")
	fs.DurationVar(&o.timing.Margin, "lease-margin", lease.DefaultTiming.Margin,
		"agents stop trusting a grant this much early, on top of drift")
	fs.DurationVar(&o.timing.DegradedTimeout, "degraded-timeout", lease.DefaultTiming.DegradedTimeout,
		"how long a lapsed region's degraded budget stays reserved (and usable by it)")
	fs.DurationVar(&o.sessionTTL, "session-ttl", coordinator.DefaultSessionTTL,
		"etcd leadership session TTL; failover takes about this long")
	fs.DurationVar(&o.etcdTimeout, "etcd-timeout", coordinator.DefaultEtcdTimeout,
		"most any etcd call may take; past it etcd counts as unreachable, which the log, /readyz and admin "+
			"commands say")
	fs.DurationVar(&o.rebalance, "rebalance-interval", coordinator.DefaultRebalanceInterval,
		"how often shares are recomputed")
	fs.DurationVar(&o.flush, "flush-interval", coordinator.DefaultFlushInterval,
		"how often lowered ledger marks are written to etcd")
	fs.DurationVar(&o.compaction, "etcd-compaction-interval", coordinator.DefaultCompactionInterval,
		"how often the leader compacts etcd's history, keeping one to two intervals of it, so etcd does not "+
			"fill up (0: off, for an etcd compacted another way; docs/runbook.md)")
	fs.StringVar(&o.strategy, "strategy", string(allocation.StrategyMaxMinFair),
		"allocation strategy: static, demand or max-min-fair")
	fs.Float64Var(&o.maxStep, "max-step", coordinator.DefaultMaxStep,
		"most a share moves per rebalancing round, as a fraction of the quota")
	fs.Float64Var(&o.hysteresis, "hysteresis", coordinator.DefaultHysteresis,
		"share changes smaller than this fraction of the quota are not made")
	fs.DurationVar(&o.clockStep, "redis-clock-step", 0,
		"most a region's Redis clock may step back within one window (a wall-clock step, not a slew); enters "+
			"the published bound of fixed-window policies as the window-clock term. 0 where Redis hosts slew their "+
			"clocks")
	fs.DurationVar(&o.lag, "store-lag", 0,
		"most recent writes a region's Redis may lose when it fails over to a replica (its replication lag); "+
			"enters the published bound as the store-lag term. 0 where Redis does not fail over to replicas")
	fs.Float64Var(&o.leaseRate, "lease-call-rate", coordinator.DefaultLeaseCallRate,
		"most Lease calls per second one region's certificate may make (burst twice that); more are refused "+
			"before they touch the ledger. An agent instance renews about every third of a lease")
	o.etcdAccess = addEtcdAccessFlags(fs)
	o.tls = mtls.ServerFlags(fs)
	o.xds = addXDSFlags(fs)
	fs.StringVar(&o.trustDomain, "trust-domain", "quota-lease",
		"SPIFFE trust domain of the identities in client certificates (spiffe://<domain>/region/<r>, "+
			"/role/admin, /role/viewer)")
	fs.BoolVar(&o.insecure, "insecure", false,
		"allow listening on a non-loopback address without mutual TLS (anyone who reaches it can lease and "+
			"administer)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.BoolVar(&o.logJSON, "log-json", false, "log as JSON lines instead of text")
	envflag.AddConfigFlag(fs)
	if err := envflag.Preset(fs, args); err != nil {
		return nil, err
	}
	return o, parse(fs, args, 0, 0)
}

// serveConfig is a replica ready to run: its coordinator configuration,
// where it serves, and how it reaches etcd.
type serveConfig struct {
	coord              coordinator.Config
	console            *console.Config // nil: no console
	listen, httpListen string
	debug              cli.Debug
	tls                mtls.Listeners
	etcd               etcdSetup
	log                hclog.Logger
}

// etcdSetup is the etcd a replica uses: one it starts (embedded) or the
// endpoints of a running cluster.
type etcdSetup struct {
	embedded        bool
	dataDir, listen string   // embedded
	endpoints       []string // external
	access          *etcdAccess
}

// config checks the options and makes the replica's configuration and
// logger (on stderr); its errors name the flag at fault.
func (o *serveOptions) config(stderr io.Writer) (serveConfig, error) {
	var sc serveConfig
	if o.withConsole {
		if err := o.console.Validate(); err != nil {
			return sc, fmt.Errorf("%w (see --console-sample, --console-history, --console-refresh)", err)
		}
		sc.console = &o.console
	}
	log, err := logs.New("coordinator", o.logLevel, o.logJSON, stderr)
	if err != nil {
		return sc, err
	}
	log.Info("starting", "build", version.Get().String())
	if o.etcdMode == "embedded" && o.endpoints == "" && !mtls.IsLoopback(o.etcdListen) {
		return sc, fmt.Errorf("--etcd-listen %s: the embedded etcd has no TLS or auth and listens on loopback "+
			"only; for a cluster reachable from the network run an external etcd (--etcd-endpoints)", o.etcdListen)
	}
	addrs := map[string]string{"--listen": o.listen, "--http-listen": o.httpListen}
	sc.tls, err = mtls.SetUp(*o.tls, addrs, o.insecure, func(w string) { log.Warn(w) })
	if err != nil {
		return sc, err
	}
	if sc.etcd, err = o.etcdSetup(); err != nil {
		return sc, err
	}
	sc.listen, sc.httpListen, sc.log = o.listen, o.httpListen, log
	sc.debug = cli.Debug{Addr: o.debugListen, Insecure: o.insecure}
	if err := sc.debug.Check(log); err != nil {
		return sc, err
	}
	sc.coord = o.coordinatorConfig(sc.tls.Mutual, log)
	if sc.coord.RateLimitXDS, err = o.xds.settings(o.insecure, o.tls.CA, func(w string) { log.Warn(w) }); err != nil {
		return sc, err
	}
	if err := coordinator.ValidateConfig(sc.coord); err != nil {
		return sc, fmt.Errorf("coordinator config: %w", err)
	}
	return sc, nil
}

// etcdSetup is the etcd --etcd and --etcd-endpoints name (endpoints imply
// external).
func (o *serveOptions) etcdSetup() (etcdSetup, error) {
	e := etcdSetup{dataDir: o.dataDir, listen: o.etcdListen, access: o.etcdAccess}
	switch {
	case o.endpoints != "":
		e.endpoints = strings.Split(o.endpoints, ",")
	case o.etcdMode == "embedded":
		e.embedded = true
	case o.etcdMode == "external":
		return e, fmt.Errorf("--etcd external needs --etcd-endpoints")
	default:
		return e, fmt.Errorf("--etcd must be embedded or external, got %q", o.etcdMode)
	}
	return e, nil
}

// coordinatorConfig is the coordinator configuration the options give;
// authorization (the trust domain) is on only with mutual TLS.
func (o *serveOptions) coordinatorConfig(mutual bool, log hclog.Logger) coordinator.Config {
	cfg := coordinator.DefaultConfig()
	cfg.Name, cfg.Advertise, cfg.Prefix = o.name, o.advertise, o.prefix
	if cfg.Advertise == "" {
		cfg.Advertise = o.listen
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(o.listen)
		cfg.Name = host + ":" + port
	}
	if o.regions != "" {
		cfg.Regions = strings.Split(o.regions, ",")
	}
	if mutual {
		cfg.TrustDomain = o.trustDomain
	}
	cfg.Timing, cfg.SessionTTL, cfg.RebalanceInterval, cfg.FlushInterval = o.timing, o.sessionTTL, o.rebalance, o.flush
	cfg.CompactionInterval = o.compaction
	cfg.EtcdTimeout = o.etcdTimeout
	cfg.Strategy, cfg.MaxStep, cfg.Hysteresis = allocation.Strategy(o.strategy), o.maxStep, o.hysteresis
	cfg.StoreLag, cfg.RedisClockStep, cfg.LeaseCallRate, cfg.Logger = o.lag, o.clockStep, o.leaseRate, log
	return cfg
}

// serve runs a replica until ctx is done, then steps down, drains and
// returns.
func serve(ctx context.Context, sc serveConfig) error {
	stopDebug, err := sc.debug.Serve(sc.log)
	if err != nil {
		return err
	}
	defer stopDebug()
	etcd, eps, closeEtcd, err := sc.etcd.connect(ctx, sc.log)
	if err != nil {
		return err
	}
	defer closeEtcd()
	c, err := coordinator.New(etcd, sc.coord)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", sc.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another replica using it? pick another with --listen)", sc.listen, err)
	}
	opts := c.ServerOptions()
	if sc.tls.GRPC != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(sc.tls.GRPC)))
	}
	srv := grpc.NewServer(opts...)
	c.Register(srv)
	go srv.Serve(lis)
	if sc.httpListen != "" {
		hsrv, err := serveHTTP(ctx, c, sc)
		if err != nil {
			return err
		}
		defer hsrv.Close()
	}
	sc.log.Info("serving", "listen", lis.Addr().String(), "advertise", sc.coord.Advertise, "etcd", strings.Join(eps, ","),
		"tls", sc.tls.GRPC != nil, "authorization", sc.coord.TrustDomain != "",
		"ratelimit_xds", xdsServer(sc.coord.RateLimitXDS))

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(runCtx); close(done) }()
	<-ctx.Done()
	sc.log.Info("shutting down: stepping down and draining")
	stop()
	<-done
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	sc.log.Info("stopped")
	return nil
}

// connect starts the embedded etcd if there is one and returns a client
// of the etcd, its endpoints, and what closes both.
func (e etcdSetup) connect(ctx context.Context, log hclog.Logger) (*clientv3.Client, []string, func(), error) {
	eps, closeEmbedded := e.endpoints, func() {}
	if e.embedded {
		if err := os.MkdirAll(e.dataDir, 0o700); err != nil {
			return nil, nil, nil, fmt.Errorf("data dir: %w", err)
		}
		ee, err := etcdembed.Start(ctx, etcdembed.Config{Dir: e.dataDir, ClientAddr: e.listen})
		if err != nil {
			return nil, nil, nil, err
		}
		abs, _ := filepath.Abs(e.dataDir)
		log.Info("embedded etcd ready", "endpoint", ee.Endpoint, "data_dir", abs)
		eps, closeEmbedded = []string{ee.Endpoint}, func() { ee.Close() }
	}
	ecfg, err := e.access.config(eps)
	if err == nil {
		var cli *clientv3.Client
		if cli, err = clientv3.New(ecfg); err == nil {
			return cli, eps, func() { cli.Close(); closeEmbedded() }, nil
		}
		err = &coordinator.EtcdError{Op: "connect", Endpoints: eps, Err: err}
	}
	closeEmbedded()
	return nil, nil, nil, err
}

// serveHTTP serves the console (if any), /metrics and the health checks
// on --http-listen.
func serveHTTP(ctx context.Context, c *coordinator.Coordinator, sc serveConfig) (*http.Server, error) {
	hl, err := net.Listen("tcp", sc.httpListen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (choose another with --http-listen)", sc.httpListen, err)
	}
	var ch http.Handler
	if sc.console != nil {
		cons := *sc.console
		cons.Logger = sc.log.Named("console")
		con, err := console.New(consoleSource{c.Admin(), c}, cons)
		if err != nil {
			hl.Close()
			return nil, err
		}
		go con.Run(ctx)
		ch = con
	}
	hsrv := &http.Server{
		Handler:           c.HTTPHandler(ch),
		TLSConfig:         sc.tls.HTTP,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	if sc.tls.HTTP != nil {
		go hsrv.ServeTLS(hl, "", "")
	} else {
		go hsrv.Serve(hl)
	}
	return hsrv, nil
}

// consoleSource is what the console reads: the admin service's reads and
// the replica's leadership.
type consoleSource struct {
	*coordinator.AdminService
	*coordinator.Coordinator
}
