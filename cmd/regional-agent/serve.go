package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/internal/agent"
	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/agent/rlqs"
	"github.com/quota-lease/quota-lease/internal/cli"
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
        envoy.service.ratelimit.v3.RateLimitService (--grpc-listen),
        and Envoy's Rate Limit Quota Service (RLQS) for policies with edge
        settings: token buckets assigned to Envoy instances (--edge-*)
  HTTP  POST /v1/check, GET /metrics, /healthz, /readyz (--http-listen)

When its lease may have expired and cannot be renewed it enforces the
policy's degraded budget; when Redis is slower than --check-timeout or down
it decides from a bounded in-process fallback. On SIGINT or SIGTERM it
stops being ready, finishes in-flight checks and exits.

Every flag can also be set from the environment (--tls-cert from
QUOTALEASE_TLS_CERT, and so on) and from a YAML file (--config FILE, keys
the flag names: "tls-cert: /etc/...", see deploy/config/agent.yaml); the command
line wins over the environment, which wins over the file.
`

// runServe runs the serve command: flags, then the configuration they
// make, then the agent.
func runServe(ctx context.Context, args []string, stderr io.Writer) error {
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
	region, instance, coordinators, policies, clusterID  string
	grpcListen, httpListen, metricIDs, coordCA, logLevel string
	debugListen                                          string
	trustDomain                                          string
	httpRateLimitHeaders                                 string
	redis                                                redisTarget
	tls                                                  *mtls.Files
	hints, envoyHeaders, shadow, insecure, logJSON       bool
	envoyRetryAfter, envoyPolicyNames, envoyExact        bool
	envoyQuotaMode, envoyDynamicMetadata                 bool
	skew, checkTimeout, margin, policyRefresh, drain     time.Duration
	pipelines, fallbackKeys, httpConns                   int
	drift                                                float64
	edge                                                 rlqs.Config
}

// serveFlags defines serve's flags and parses args over the environment
// and --config; --region is required.
func serveFlags(args []string, stderr io.Writer) (*serveOptions, error) {
	o := &serveOptions{}
	fs := cli.NewFlags("serve", serveUsage, stderr)
	host, _ := os.Hostname()
	fs.StringVar(&o.region, "region", "", "region this agent enforces for (required)")
	fs.StringVar(&o.instance, "instance", host, "this agent's name within the region (unique per process)")
	fs.StringVar(&o.redis.addr, "redis", "127.0.0.1:6379", redisUsage)
	fs.StringVar(&o.redis.passwordFile, "redis-password-file", "",
		"file holding the Redis password (else env QUOTALEASE_REDIS_PASSWORD, else the URL's); never logged")
	fs.StringVar(&o.redis.sentinelPasswordFile, "redis-sentinel-password-file", "",
		"file holding the Redis Sentinels' password (else env QUOTALEASE_REDIS_SENTINEL_PASSWORD); never logged")
	fs.StringVar(&o.redis.caFile, "redis-tls-ca", "",
		"PEM CA that signs Redis's certificate (turns TLS on; rediss:// without it uses the system roots)")
	fs.StringVar(&o.coordinators, "coordinator", "127.0.0.1:7400", "coordinator replicas, host:port[,host:port...]")
	fs.BoolVar(&o.hints, "coordinator-hints", true,
		"follow the leader address that followers name; turn off when the coordinators are reached through "+
			"proxies or NAT their advertised addresses bypass")
	fs.StringVar(&o.policies, "policies", "", "load policies from this YAML file instead of the coordinator")
	fs.DurationVar(&o.skew, "saved-clock-skew", time.Second,
		"the most the wall clocks of this region's agent hosts may disagree: a grant restored from the region's "+
			"Redis at start (during a coordinator outage) is trusted this much less long")
	fs.StringVar(&o.grpcListen, "grpc-listen", "127.0.0.1:7500", "gRPC address (check API and Envoy rate-limit API)")
	fs.StringVar(&o.httpListen, "http-listen", "127.0.0.1:7501", "HTTP address (/v1/check, /metrics, /healthz, /readyz)")
	fs.StringVar(&o.debugListen, "debug-listen", "", cli.DebugFlagHelp)
	fs.DurationVar(&o.checkTimeout, "check-timeout", 20*time.Millisecond,
		"longest a check waits for Redis before the local fallback decides")
	fs.IntVar(&o.pipelines, "redis-pipelines", agent.DefaultConfig().RedisPipelines,
		"pipelines of concurrent checks in flight to Redis at once; each carries every check that queued "+
			"meanwhile (no timer: an idle agent adds no latency). 0 sends every check on its own")
	fs.Float64Var(&o.drift, "drift", lease.DefaultTiming.Drift,
		"bound on this host's clock rate error; a coordinator assuming a larger one (its --drift) wins")
	fs.DurationVar(&o.margin, "lease-margin", lease.DefaultTiming.Margin,
		"stop trusting a grant this much early, on top of drift")
	fs.IntVar(&o.fallbackKeys, "fallback-keys", 100_000, "most identities the local fallback tracks")
	fs.DurationVar(&o.policyRefresh, "policy-refresh", 10*time.Second,
		"reload the policies at least this often; a grant computed from a changed policy, or a check naming an "+
			"unknown one, reloads them at once")
	fs.StringVar(&o.clusterID, "cluster-id", "",
		"the cluster ID the coordinators must have (they log it at start); without it the agent pins the "+
			"cluster of the first answer. Either way a coordinator of another deployment is refused")
	answerFlags(fs, o)
	edgeFlags(fs, &o.edge)
	o.tls = mtls.ServerFlags(fs)
	fs.StringVar(&o.coordCA, "coordinator-tls-ca", os.Getenv("QUOTALEASE_TLS_CA"),
		"PEM CA that signs the coordinators' certificates; turns TLS on toward them, presenting --tls-cert (the "+
			"region's identity) as the client certificate (env QUOTALEASE_TLS_CA)")
	fs.StringVar(&o.trustDomain, "trust-domain", "quota-lease",
		"SPIFFE trust domain of the coordinators (their serve --trust-domain): with --coordinator-tls-ca, a "+
			"server is accepted as a coordinator only if its certificate names spiffe://<domain>/role/coordinator")
	fs.DurationVar(&o.drain, "drain-delay", 0,
		"on SIGTERM, answer /readyz 503 (and gRPC health NOT_SERVING) for this long while still serving checks, "+
			"before waiting for in-flight ones and closing: set it to your load balancer's probe period")
	fs.StringVar(&o.httpRateLimitHeaders, "http-ratelimit-headers", httplimit.Draft06,
		"the RateLimit response fields of the HTTP API, by the version of the IETF draft they follow: draft-06 "+
			"(draft-ietf-httpapi-ratelimit-headers-06: RateLimit-Limit, -Remaining, -Reset and -Policy), draft-11 "+
			"(draft-ietf-httpapi-ratelimit-headers-11: structured RateLimit-Policy and RateLimit, with a partition "+
			"key) or none; a 429 carries Retry-After whichever")
	fs.IntVar(&o.httpConns, "http-max-conns", checkapi.DefaultMaxHTTPConns,
		"most open HTTP connections; more wait to be accepted, so slow clients cannot exhaust file descriptors. "+
			"At most half of them (and 1,024) may be still handshaking, 64 from one address, for 3 s at most")
	fs.BoolVar(&o.insecure, "insecure", false,
		"allow listening on a non-loopback address without mutual TLS (anyone who reaches it can check and read "+
			"metrics)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	fs.BoolVar(&o.logJSON, "log-json", false, "log as JSON lines instead of text")
	envflag.AddConfigFlag(fs)
	if err := envflag.Preset(fs, args); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, cli.ErrUsage
	}
	if o.region == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "serve: --region is required")
		return nil, cli.ErrUsage
	}
	return o, nil
}

// answerFlags defines the flags that choose what the agent's answers carry
// beyond the decision: Envoy's extras, shadow mode and the hot-identity
// metric's names.
func answerFlags(fs *flag.FlagSet, o *serveOptions) {
	fs.BoolVar(&o.envoyHeaders, "envoy-limit-headers", false,
		"add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to Envoy answers for the descriptor "+
			"closest to its limit (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.BoolVar(&o.envoyQuotaMode, "envoy-quota-mode", false,
		"every limit in quota mode for Envoy answers (envoyproxy/ratelimit's QUOTA_MODE): a descriptor over its "+
			"limit is answered OK and never makes the call OVER_LIMIT; per limit, quota_mode: true in the "+
			"configuration")
	fs.BoolVar(&o.envoyDynamicMetadata, "envoy-dynamic-metadata", false,
		"add dynamic_metadata (domain, descriptors, hits, quota-mode violations) to Envoy answers "+
			"(envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA)")
	fs.BoolVar(&o.envoyRetryAfter, "envoy-retry-after", false,
		"quota-lease extra: add a retry-after header (whole seconds, the longest wait of the descriptors over "+
			"their limit) to Envoy OVER_LIMIT answers; envoyproxy/ratelimit adds none")
	fs.BoolVar(&o.envoyPolicyNames, "envoy-policy-names", false,
		"quota-lease extra: name every Envoy answer's current_limit after its policy, also where the "+
			"configuration names none (envoyproxy/ratelimit leaves the name empty there)")
	fs.BoolVar(&o.envoyExact, "envoy-exact-counts", false,
		"quota-lease extra: Envoy answers report what is left of a limit also when over it "+
			"(envoyproxy/ratelimit reports 0) and duration_until_reset to the millisecond (it reports whole "+
			"seconds)")
	fs.BoolVar(&o.shadow, "shadow-mode", false,
		"shadow mode for every policy: decide and count as usual, admit everything (rejections are counted as "+
			"result=\"shadow\"); for watching limits before enforcing them")
	fs.StringVar(&o.metricIDs, "metric-identities", agent.IdentitiesHashed,
		"how the hot-identity metric names identities (tenants, IPs): hashed (sha256:<12 hex>), plain (opt in "+
			"to the names) or off")
}

// serveConfig is an agent ready to run: its configuration (but for the
// clients serve makes: Redis, Coordinator, Policies), how it reaches Redis
// and the coordinators, and where it serves.
type serveConfig struct {
	agent                  agent.Config
	redis                  *redis.UniversalOptions
	redisShown             string // the Redis target without secrets
	coordinators           []string
	hints                  bool
	clusterID              string
	coordTLS               *tls.Config // nil: plaintext to the coordinators
	policiesFile           string      // "": the coordinator's policies
	grpcListen, httpListen string
	debug                  cli.Debug
	httpConns              int
	drainDelay             time.Duration
	tls                    mtls.Listeners
	log                    hclog.Logger
}

// config checks the options and makes the agent's configuration and
// logger (on stderr); its errors name the flag at fault.
func (o *serveOptions) config(stderr io.Writer) (serveConfig, error) {
	var sc serveConfig
	log, err := logs.New("regional-agent", o.logLevel, o.logJSON, stderr)
	if err != nil {
		return sc, err
	}
	logs.RouteRedis(log)
	log.Info("starting", "build", version.Get().String())
	addrs := map[string]string{"--grpc-listen": o.grpcListen, "--http-listen": o.httpListen}
	sc.tls, err = mtls.SetUp(*o.tls, addrs, o.insecure, func(w string) { log.Warn(w) })
	if err != nil {
		return sc, err
	}
	if o.coordCA != "" {
		files := mtls.Files{CA: o.coordCA, Cert: o.tls.Cert, Key: o.tls.Key}
		if sc.coordTLS, err = leaseapi.CoordinatorTLS(files, o.trustDomain); err != nil {
			return sc, err
		}
	}
	if sc.redis, sc.redisShown, err = o.redis.options(); err != nil {
		return sc, err
	}
	if o.httpConns < 2 {
		return sc, fmt.Errorf("--http-max-conns %d: at least 2 (one for a client while another handshakes)", o.httpConns)
	}
	sc.coordinators, sc.hints = strings.Split(o.coordinators, ","), o.hints
	sc.clusterID, sc.policiesFile = o.clusterID, o.policies
	sc.grpcListen, sc.httpListen, sc.httpConns = o.grpcListen, o.httpListen, o.httpConns
	sc.drainDelay, sc.log = o.drain, log
	sc.debug = cli.Debug{Addr: o.debugListen, Insecure: o.insecure}
	if err := sc.debug.Check(log); err != nil {
		return sc, err
	}
	cfg := agent.DefaultConfig()
	cfg.Region, cfg.Instance, cfg.SavedClockSkew = o.region, o.instance, o.skew
	cfg.CheckTimeout, cfg.RedisPipelines, cfg.Drift, cfg.Margin = o.checkTimeout, o.pipelines, o.drift, o.margin
	cfg.FallbackKeys, cfg.PolicyRefresh, cfg.MetricIdentities = o.fallbackKeys, o.policyRefresh, o.metricIDs
	cfg.Shadow, cfg.EnvoyLimitHeaders, cfg.Logger = o.shadow, o.envoyHeaders, log
	cfg.EnvoyRetryAfter, cfg.EnvoyPolicyNames, cfg.EnvoyExactCounts = o.envoyRetryAfter, o.envoyPolicyNames, o.envoyExact
	cfg.EnvoyQuotaMode, cfg.EnvoyDynamicMetadata = o.envoyQuotaMode, o.envoyDynamicMetadata
	cfg.HTTPRateLimitHeaders = o.httpRateLimitHeaders
	if err := o.edge.Validate(); err != nil {
		return sc, fmt.Errorf("the --edge-* flags: %w", err)
	}
	cfg.Edge = o.edge
	sc.agent = cfg
	return sc, nil
}

// serve runs the agent until ctx is done (or the agent fails), then stops
// being ready, drains and returns.
func serve(ctx context.Context, sc serveConfig) error {
	stopDebug, err := sc.debug.Serve(sc.log)
	if err != nil {
		return err
	}
	defer stopDebug()
	rdb := redis.NewUniversalClient(sc.redis)
	defer rdb.Close()
	cl, err := leaseapi.NewClient(sc.coordinators)
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.SetFollowHints(sc.hints)
	cl.SetClusterID(sc.clusterID)
	if sc.coordTLS != nil {
		cl.UseTLS(sc.coordTLS)
	}
	cfg := sc.agent
	cfg.Redis, cfg.Coordinator = rdb, cl
	cfg.Policies, cfg.KeepPolicies = agent.PoliciesFromCoordinator(cl), true
	if sc.policiesFile != "" {
		cfg.Policies, cfg.KeepPolicies = agent.PoliciesFromFile(sc.policiesFile), false
	}
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until the agent is ready
	cfg.OnReadiness = followReadiness(hs, sc.log)
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	s, err := listen(a, hs, sc)
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(runCtx) }()
	s.start()
	sc.log.Info("serving", "region", cfg.Region, "instance", cfg.Instance,
		"grpc", s.gl.Addr().String(), "http", s.hl.Addr().String(), "redis", sc.redisShown)

	select {
	case <-ctx.Done():
	case err := <-runErr:
		if err != nil {
			return err
		}
	}
	s.drain(a, sc.drainDelay, sc.log)
	stop()
	sc.log.Info("stopped")
	return nil
}

// servers are an agent's listeners and the servers on them.
type servers struct {
	gl, hl net.Listener
	gs     *grpc.Server
	health *health.Server
	hsrv   *http.Server
}

// listen opens the gRPC and HTTP listeners and makes their servers.
func listen(a *agent.Agent, hs *health.Server, sc serveConfig) (*servers, error) {
	gl, err := net.Listen("tcp", sc.grpcListen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (choose another with --grpc-listen)", sc.grpcListen, err)
	}
	hl, err := net.Listen("tcp", sc.httpListen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (choose another with --http-listen)", sc.httpListen, err)
	}
	gopts := checkapi.GRPCServerOptions()
	if sc.tls.GRPC != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(sc.tls.GRPC)))
	}
	s := &servers{gl: gl, gs: grpc.NewServer(gopts...), health: hs}
	a.RegisterGRPC(s.gs)
	healthpb.RegisterHealthServer(s.gs, s.health)
	handler := a.HTTPHandler()
	if sc.tls.Mutual {
		handler = mtls.RequireClientCert(handler, "/metrics", "/healthz", "/readyz")
	}
	lc := checkapi.DefaultHTTPListener(sc.tls.HTTP, sc.httpConns)
	if s.hsrv, s.hl, err = a.ListenHTTP(hl, handler, lc); err != nil {
		gl.Close()
		hl.Close()
		return nil, err
	}
	return s, nil
}

// start serves on the listeners.
func (s *servers) start() {
	go s.gs.Serve(s.gl)
	go s.hsrv.Serve(s.hl) // TLS or not: the listener did the handshake
}

// drain stops being ready, keeps serving for delay, then waits for the
// checks in flight (10s more at most) and closes the servers.
func (s *servers) drain(a *agent.Agent, delay time.Duration, log hclog.Logger) {
	log.Info("shutting down: not ready, draining", "drain_delay", delay)
	s.health.Shutdown() // NOT_SERVING from now on, whatever readiness says
	dctx, cancel := context.WithTimeout(context.Background(), delay+10*time.Second)
	defer cancel()
	a.Drain(dctx, delay)
	s.hsrv.Shutdown(dctx)
	done := make(chan struct{})
	go func() { s.gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-dctx.Done():
		s.gs.Stop()
	}
}

// followReadiness is the agent's OnReadiness: it keeps the gRPC health
// status hs equal to the agent's readiness (what /readyz answers) and logs
// each change with its reason. A drain sets NOT_SERVING itself, for good.
func followReadiness(hs *health.Server, log hclog.Logger) func(ready bool, why string) {
	was := false
	return func(ok bool, why string) {
		switch {
		case ok && !was:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			log.Info("ready")
		case !ok && was:
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			log.Warn("not ready", "reason", why)
		case !ok:
			log.Debug("not ready", "reason", why)
		}
		was = ok
	}
}
