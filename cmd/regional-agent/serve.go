package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quota-lease/quota-lease/internal/agent"
	"github.com/quota-lease/quota-lease/internal/envflag"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/version"
	"github.com/quota-lease/quota-lease/lease"
)

const serveUsage = `Usage: regional-agent serve --region R --redis ADDR|URL --coordinator ADDR[,ADDR...] [flags]

Runs the agent of one region. It loads the policies from the coordinator
(or --policies FILE), leases a share of every global policy, and answers
checks against the region's Redis over:
  gRPC  quotalease.v1.CheckService and Envoy's
        envoy.service.ratelimit.v3.RateLimitService (--grpc-listen)
  HTTP  POST /v1/check, GET /metrics, /healthz, /readyz (--http-listen)

When its lease may have expired and cannot be renewed it enforces the
policy's degraded budget; when Redis is slower than --check-timeout or down
it decides from a bounded in-process fallback. On SIGINT or SIGTERM it
stops being ready, finishes in-flight checks and exits.

Every flag can also be set from the environment (--tls-cert from
QUOTALEASE_TLS_CERT, and so on) and from a YAML file (--config FILE, keys
the flag names: "tls-cert: /etc/...", see deploy/config/agent.yaml); the command
line wins over the environment, which wins over the file.

Flags:
`

func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage); fs.PrintDefaults() }
	host, _ := os.Hostname()
	region := fs.String("region", "", "region this agent enforces for (required)")
	instance := fs.String("instance", host, "this agent's name within the region (unique per process)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", redisUsage)
	redisPasswordFile := fs.String("redis-password-file", "", "file holding the Redis password (else env QUOTALEASE_REDIS_PASSWORD, else the URL's); never logged")
	sentinelPasswordFile := fs.String("redis-sentinel-password-file", "", "file holding the Redis Sentinels' password (else env QUOTALEASE_REDIS_SENTINEL_PASSWORD); never logged")
	redisCA := fs.String("redis-tls-ca", "", "PEM CA that signs Redis's certificate (turns TLS on; rediss:// without it uses the system roots)")
	coordAddrs := fs.String("coordinator", "127.0.0.1:7400", "coordinator replicas, host:port[,host:port...]")
	hints := fs.Bool("coordinator-hints", true, "follow the leader address that followers name; turn off when the coordinators are reached through proxies or NAT their advertised addresses bypass")
	policies := fs.String("policies", "", "load policies from this YAML file instead of the coordinator")
	skew := fs.Duration("saved-clock-skew", time.Second, "the most the wall clocks of this region's agent hosts may disagree: a grant restored from the region's Redis at start (during a coordinator outage) is trusted this much less long")
	grpcListen := fs.String("grpc-listen", "127.0.0.1:7500", "gRPC address (check API and Envoy rate-limit API)")
	httpListen := fs.String("http-listen", "127.0.0.1:7501", "HTTP address (/v1/check, /metrics, /healthz, /readyz)")
	checkTimeout := fs.Duration("check-timeout", 20*time.Millisecond, "longest a check waits for Redis before the local fallback decides")
	pipelines := fs.Int("redis-pipelines", agent.DefaultConfig().RedisPipelines, "pipelines of concurrent checks in flight to Redis at once; each carries every check that queued meanwhile (no timer: an idle agent adds no latency). 0 sends every check on its own")
	drift := fs.Float64("drift", lease.DefaultTiming.Drift, "bound on this host's clock rate error; a coordinator assuming a larger one (its --drift) wins")
	margin := fs.Duration("lease-margin", lease.DefaultTiming.Margin, "stop trusting a grant this much early, on top of drift")
	fallbackKeys := fs.Int("fallback-keys", 100_000, "most identities the local fallback tracks")
	policyRefresh := fs.Duration("policy-refresh", 10*time.Second, "reload the policies at least this often; a grant computed from a changed policy, or a check naming an unknown one, reloads them at once")
	clusterID := fs.String("cluster-id", "", "the cluster ID the coordinators must have (they log it at start); without it the agent pins the cluster of the first answer. Either way a coordinator of another deployment is refused")
	envoyHeaders := fs.Bool("envoy-limit-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to Envoy answers for the descriptor closest to its limit (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	shadow := fs.Bool("shadow-mode", false, "shadow mode for every policy: decide and count as usual, admit everything (rejections are counted as result=\"shadow\"); for watching limits before enforcing them")
	metricIDs := fs.String("metric-identities", agent.IdentitiesHashed, "how the hot-identity metric names identities (tenants, IPs): hashed (sha256:<12 hex>), plain (opt in to the names) or off")
	tlsFiles := mtls.ServerFlags(fs)
	coordCA := fs.String("coordinator-tls-ca", os.Getenv("QUOTALEASE_TLS_CA"), "PEM CA that signs the coordinators' certificates; turns TLS on toward them, presenting --tls-cert (the region's identity) as the client certificate (env QUOTALEASE_TLS_CA)")
	drainDelay := fs.Duration("drain-delay", 0, "on SIGTERM, answer /readyz 503 (and gRPC health NOT_SERVING) for this long while still serving checks, before waiting for in-flight ones and closing: set it to your load balancer's probe period")
	httpConns := fs.Int("http-max-conns", agent.DefaultMaxHTTPConns, "most open HTTP connections; more wait to be accepted, so slow clients cannot exhaust file descriptors")
	insecureListen := fs.Bool("insecure", false, "allow listening on a non-loopback address without mutual TLS (anyone who reaches it can check and read metrics)")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines instead of text")
	envflag.AddConfigFlag(fs)
	if err := envflag.Preset(fs, args); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if *region == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "serve: --region is required")
		return errUsage
	}
	log, err := logs.New("regional-agent", *logLevel, *logJSON, stderr)
	if err != nil {
		return err
	}
	logs.RouteRedis(log)
	log.Info("starting", "build", version.Get().String())
	tl, err := mtls.SetUp(*tlsFiles, map[string]string{"--grpc-listen": *grpcListen, "--http-listen": *httpListen}, *insecureListen, func(w string) { log.Warn(w) })
	if err != nil {
		return err
	}
	var coordTLS *tls.Config
	if *coordCA != "" {
		if coordTLS, err = mtls.Client(mtls.Files{CA: *coordCA, Cert: tlsFiles.Cert, Key: tlsFiles.Key}, ""); err != nil {
			return err
		}
	}
	ropts, redisShown, err := redisTarget{addr: *redisAddr, passwordFile: *redisPasswordFile, sentinelPasswordFile: *sentinelPasswordFile, caFile: *redisCA}.options()
	if err != nil {
		return err
	}
	rdb := redis.NewUniversalClient(ropts)
	defer rdb.Close()
	cl, err := leaseapi.NewClient(strings.Split(*coordAddrs, ","))
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.SetFollowHints(*hints)
	cl.SetClusterID(*clusterID)
	if coordTLS != nil {
		cl.UseTLS(coordTLS)
	}
	src, keep := agent.PoliciesFromCoordinator(cl), true
	if *policies != "" {
		src, keep = agent.PoliciesFromFile(*policies), false
	}
	cfg := agent.DefaultConfig()
	cfg.Region, cfg.Instance, cfg.Redis, cfg.Coordinator = *region, *instance, rdb, cl
	cfg.Policies, cfg.KeepPolicies, cfg.SavedClockSkew = src, keep, *skew
	cfg.CheckTimeout, cfg.RedisPipelines, cfg.Drift, cfg.Margin = *checkTimeout, *pipelines, *drift, *margin
	cfg.FallbackKeys, cfg.PolicyRefresh, cfg.MetricIdentities = *fallbackKeys, *policyRefresh, *metricIDs
	cfg.Shadow, cfg.EnvoyLimitHeaders, cfg.Logger = *shadow, *envoyHeaders, log
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", *grpcListen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with --grpc-listen)", *grpcListen, err)
	}
	hl, err := net.Listen("tcp", *httpListen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with --http-listen)", *httpListen, err)
	}
	gopts := agent.GRPCServerOptions()
	if tl.GRPC != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tl.GRPC)))
	}
	gs := grpc.NewServer(gopts...)
	a.RegisterGRPC(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	handler := a.HTTPHandler()
	if tl.Mutual {
		handler = mtls.RequireClientCert(handler, "/metrics", "/healthz", "/readyz")
	}
	hsrv := agent.NewHTTPServer(handler, tl.HTTP)
	hl = agent.CapConns(hl, *httpConns)

	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(runCtx) }()
	go gs.Serve(gl)
	if tl.HTTP != nil {
		go hsrv.ServeTLS(hl, "", "")
	} else {
		go hsrv.Serve(hl)
	}
	log.Info("serving", "region", *region, "instance", *instance, "grpc", gl.Addr().String(), "http", hl.Addr().String(), "redis", redisShown)
	go followReadiness(runCtx, a, hs, log)

	select {
	case <-ctx.Done():
	case err := <-runErr:
		if err != nil {
			return err
		}
	}
	log.Info("shutting down: not ready, draining", "drain_delay", *drainDelay)
	hs.Shutdown() // NOT_SERVING from now on, whatever readiness says
	dctx, cancel := context.WithTimeout(context.Background(), *drainDelay+10*time.Second)
	defer cancel()
	a.Drain(dctx, *drainDelay)
	hsrv.Shutdown(dctx)
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-dctx.Done():
		gs.Stop()
	}
	stop()
	log.Info("stopped")
	return nil
}

// followReadiness keeps the gRPC health status equal to the agent's
// readiness (what /readyz answers), checked every 200ms, and logs each
// change with its reason.
func followReadiness(ctx context.Context, a *agent.Agent, hs *health.Server, log hclog.Logger) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	was, wasWhy := false, ""
	for {
		ok, why := a.Readiness()
		switch {
		case ok && !was:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			log.Info("ready")
		case !ok && was:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			log.Warn("not ready", "reason", why)
		case !ok && why != wasWhy:
			log.Debug("not ready", "reason", why)
		}
		was, wasWhy = ok, why
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
