// Package cluster runs a real multi-process quota-lease deployment on
// loopback: a redis-server per region, coordinator replicas (the first
// with embedded etcd, the others pointed at it) and a regional agent per
// region, each reaching the coordinators and its Redis through an
// in-process fault proxy, so a test or the demo can cut a region off,
// slow its Redis or kill the coordinator leader. The demo and the
// end-to-end tests both use it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Binaries are the built commands: the coordinator, the agent and the
// example service that uses the client library (examples/limited-service).
type Binaries struct{ Coordinator, Agent, Service string }

// Build compiles cmd/coordinator, cmd/regional-agent and
// examples/limited-service into dir.
func Build(ctx context.Context, dir string) (Binaries, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator),
		"./cmd/coordinator", "./cmd/regional-agent", "./examples/limited-service")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return Binaries{Coordinator: filepath.Join(dir, "coordinator"), Agent: filepath.Join(dir, "regional-agent"),
		Service: filepath.Join(dir, "limited-service")}, nil
}

// BuildTemp builds the commands into a new temporary directory, for a
// test binary's TestMain; remove deletes it.
func BuildTemp() (_ Binaries, remove func(), err error) {
	dir, err := os.MkdirTemp("", "quota-lease-bin-")
	if err != nil {
		return Binaries{}, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bins, err := Build(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		return Binaries{}, nil, err
	}
	return bins, func() { os.RemoveAll(dir) }, nil
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the quota-lease module")
	}
	return filepath.Dir(mod), nil
}

// Options shape a cluster.
type Options struct {
	Regions      []string
	Coordinators int
	// LeaseDuration and SessionTTL are short in tests, so that expiry and
	// failover happen within seconds.
	LeaseDuration time.Duration
	SessionTTL    time.Duration
	CheckTimeout  time.Duration
	// CoordinatorArgs are added to every coordinator's command line, and
	// AgentArgs to every agent's.
	CoordinatorArgs, AgentArgs []string
	// Stores picks a region's Redis deployment by region name: StoreSingle
	// (the default), StoreCluster or StoreSentinel.
	Stores map[string]string
	// AgentsPerRegion is how many agent instances each region runs (1 when
	// 0), all on the region's Redis, each through its own fault proxies.
	// Agents lists them region by region: region i's instance j (from 0)
	// is Agents[i*AgentsPerRegion+j], named "<region>-<j+1>".
	AgentsPerRegion int
}

// The Redis deployments a region can have (Options.Stores).
const (
	// StoreSingle is one redis-server, reached through a fault proxy
	// (AgentProcess.ToRedis).
	StoreSingle = "single"
	// StoreCluster is a Redis Cluster of three masters, reached with a
	// redis+cluster:// URL (no proxy: the cluster redirects to its nodes).
	StoreCluster = "cluster"
	// StoreSentinel is a master, a replica and a Sentinel, reached with a
	// redis+sentinel:// URL (no proxy: the Sentinel names the master).
	StoreSentinel = "sentinel"
)

// Cluster is a running deployment.
type Cluster struct {
	Dir  string
	Opts Options
	// Redis is each region's redis-server, by the index of Options.Regions
	// (nil for a region with another store); RedisClusters and Sentinels
	// hold the others by region name.
	Redis         []*redistest.Server
	RedisClusters map[string]*redistest.Cluster
	Sentinels     map[string]*redistest.Sentinel
	Etcd          *Process
	Coords        []*Process
	Agents        []*AgentProcess
	// Services are the example service's processes (StartServices).
	Services []*ServiceProcess
	bins     Binaries
	etcd     string
	admin    *leaseapi.Client
	used     map[string]bool
	pki      *pki
	// adminCreds and web reach the coordinators as an admin and the
	// agents' HTTPS listeners as a service.
	adminCreds credentials.TransportCredentials
	web        *http.Client
}

// Process is one child process. It can be killed, paused and started
// again with the same arguments, addresses and data.
type Process struct {
	Name string
	Addr string // gRPC
	// HTTP is a coordinator's console and metrics URL (https://host:port).
	HTTP string
	bin  string
	args []string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// AgentProcess is one region's agent process with its fault proxies.
type AgentProcess struct {
	*Process
	Region   string
	HTTP     string
	ToCoord  []*faultproxy.Proxy
	ToRedis  *faultproxy.Proxy
	Check    pb.CheckServiceClient
	checkCon *grpc.ClientConn
	web      *http.Client // HTTPS as a service
}

// freeAddr returns a free loopback address not handed out before by this
// cluster: a port is only reserved once its process binds it, so the
// kernel may offer it again meanwhile.
func (c *Cluster) freeAddr() (string, error) {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := l.Addr().String()
		l.Close()
		if !c.used[addr] {
			c.used[addr] = true
			return addr, nil
		}
	}
}

func (c *Cluster) start(name, bin string, args ...string) (*Process, error) {
	p := &Process{Name: name, bin: bin, args: args, dir: c.Dir}
	if err := p.run(); err != nil {
		return nil, err
	}
	return p, nil
}

// startServing starts name with the arguments args returns for fresh
// addresses and waits until its log says "serving". freeAddr can only pick
// ports free at that moment, and other packages' tests run beside these,
// so a port may be taken before the process binds it: the process then
// exits, and this tries again with new addresses.
func (c *Cluster) startServing(ctx context.Context, name, bin string, args func() ([]string, error)) (*Process, error) {
	logPath := filepath.Join(c.Dir, name+".log")
	for attempt := 1; ; attempt++ {
		a, err := args()
		if err != nil {
			return nil, err
		}
		var from int64
		if fi, err := os.Stat(logPath); err == nil {
			from = fi.Size()
		}
		p, err := c.start(name, bin, a...)
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			out := logSince(logPath, from)
			if strings.Contains(out, "serving") {
				return p, nil
			}
			if !p.Alive() {
				out = logSince(logPath, from)
				if attempt < 5 && strings.Contains(out, "address already in use") {
					break
				}
				return nil, fmt.Errorf("%s exited at start: %s", name, strings.TrimSpace(out))
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return p, nil // slow, not failed: later waits say more
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// logSince returns what a log file holds past offset from.
func logSince(path string, from int64) string {
	b, _ := os.ReadFile(path)
	if int64(len(b)) < from {
		return ""
	}
	return string(b[from:])
}

// run starts the process, appending to its log. p.mu must not be held.
func (p *Process) run() error {
	log, err := os.OpenFile(filepath.Join(p.dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Killed with this process, however it ends (a demo piped into head
	// dies of SIGPIPE before it can stop them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

func (p *Process) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// Pid is the process's ID (0 if it never started).
func (p *Process) Pid() int {
	if cmd, _ := p.current(); cmd.Process != nil {
		return cmd.Process.Pid
	}
	return 0
}

// Restart starts a process that has exited again, with the same
// arguments: a crashed coordinator or agent coming back.
func (p *Process) Restart() error {
	if p.Alive() {
		return fmt.Errorf("%s is still running", p.Name)
	}
	return p.run()
}

// Kill sends SIGKILL: the process dies without a word (no resignation).
func (p *Process) Kill() {
	cmd, done := p.current()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	<-done
}

// Pause stops the process (SIGSTOP) until Resume: a hung process whose
// connections stay open.
func (p *Process) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (p *Process) Resume() { p.signal(syscall.SIGCONT) }

func (p *Process) signal(sig syscall.Signal) {
	if cmd, _ := p.current(); cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, sig)
	}
}

// Stop sends SIGTERM (and SIGCONT, should it be paused) and waits up to
// 15 s, then kills.
func (p *Process) Stop() {
	cmd, done := p.current()
	if cmd.Process == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.Kill()
	}
}

// Alive reports whether the process still runs.
func (p *Process) Alive() bool {
	_, done := p.current()
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Start runs a cluster with its files (data, logs) in dir.
func Start(ctx context.Context, bins Binaries, dir string, o Options) (_ *Cluster, err error) {
	if len(o.Regions) == 0 {
		o.Regions = []string{"us", "eu", "ap"}
	}
	if o.Coordinators == 0 {
		o.Coordinators = 2
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 2 * time.Second
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 2 * time.Second
	}
	if o.CheckTimeout == 0 {
		o.CheckTimeout = 20 * time.Millisecond
	}
	if o.AgentsPerRegion == 0 {
		o.AgentsPerRegion = 1
	}
	c := &Cluster{
		Dir:           dir,
		Opts:          o,
		bins:          bins,
		used:          map[string]bool{},
		RedisClusters: map[string]*redistest.Cluster{},
		Sentinels:     map[string]*redistest.Sentinel{},
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if c.pki, err = newPKI(dir, o.Regions); err != nil {
		return nil, err
	}
	if c.adminCreds, err = grpcCreds(c.pki.admin); err != nil {
		return nil, err
	}
	if c.web, err = httpClient(c.pki.service); err != nil {
		return nil, err
	}
	redisArg, err := c.startRedis(dir, o)
	if err != nil {
		return nil, err
	}
	common := []string{"--regions", strings.Join(o.Regions, ","), "--lease-duration", o.LeaseDuration.String(),
		"--session-ttl", o.SessionTTL.String(), "--rebalance-interval", "200ms", "--flush-interval", "500ms",
		"--degraded-timeout", "2m", "--lease-margin", "50ms", "--log-level", "info"}
	// etcd runs on its own, so that killing any coordinator leaves it up.
	if c.Etcd, err = c.startServing(ctx, "etcd", bins.Coordinator, func() ([]string, error) {
		addr, err := c.freeAddr()
		c.etcd = "http://" + addr
		return []string{"etcd", "--data-dir", filepath.Join(dir, "etcd"), "--listen", addr}, err
	}); err != nil {
		return nil, err
	}
	var addrs []string
	for i := 0; i < o.Coordinators; i++ {
		name, addr, httpAddr := "coordinator-"+strconv.Itoa(i+1), "", ""
		p, err := c.startServing(ctx, name, bins.Coordinator, func() (_ []string, err error) {
			if addr, err = c.freeAddr(); err != nil {
				return nil, err
			}
			httpAddr, err = c.freeAddr()
			args := append([]string{"serve", "--listen", addr, "--http-listen", httpAddr, "--name", name,
				"--etcd-endpoints", c.etcd}, common...)
			args = append(args, o.CoordinatorArgs...)
			return append(args, serverArgs(c.pki.coordinator)...), err
		})
		if err != nil {
			return nil, err
		}
		p.Addr, p.HTTP = addr, "https://"+httpAddr
		c.Coords = append(c.Coords, p)
		addrs = append(addrs, addr)
	}
	if err := c.waitLeader(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if c.admin, err = leaseapi.NewClient(addrs); err != nil {
		return nil, err
	}
	adminTLS, err := clientTLS(c.pki.admin)
	if err != nil {
		return nil, err
	}
	c.admin.UseTLS(adminTLS)
	for i, region := range o.Regions {
		for j := 1; j <= o.AgentsPerRegion; j++ {
			a, err := c.startAgent(ctx, bins, i, region, j, addrs, redisArg)
			if err != nil {
				return nil, err
			}
			c.Agents = append(c.Agents, a)
		}
	}
	return c, nil
}

// startRedis starts each region's store as o.Stores says, and returns the
// --redis of each region whose store is not one redis-server (those are
// reached through a fault proxy: startAgent).
func (c *Cluster) startRedis(dir string, o Options) (map[string]string, error) {
	redisArg := map[string]string{}
	for _, r := range o.Regions {
		rd := filepath.Join(dir, "redis-"+r)
		if err := os.MkdirAll(rd, 0o755); err != nil {
			return nil, err
		}
		var s *redistest.Server
		var err error
		switch o.Stores[r] {
		case "", StoreSingle:
			s, err = redistest.StartIn(rd)
		case StoreCluster:
			var cl *redistest.Cluster
			if cl, err = redistest.StartClusterIn(rd, 3); err == nil {
				c.RedisClusters[r] = cl
				redisArg[r] = "redis+cluster://" + strings.Join(cl.Addrs(), ",")
			}
		case StoreSentinel:
			var se *redistest.Sentinel
			if se, err = redistest.StartSentinelIn(rd); err == nil {
				c.Sentinels[r] = se
				redisArg[r] = "redis+sentinel://" + se.Sentinel.Addr + "/" + redistest.MasterName
			}
		default:
			err = fmt.Errorf("unknown store %q", o.Stores[r])
		}
		if err != nil {
			return nil, fmt.Errorf("redis for %s: %w", r, err)
		}
		c.Redis = append(c.Redis, s)
	}
	return redisArg, nil
}

// startAgent starts instance j (from 1) of region i's agent, reaching every
// coordinator and (for a single redis-server) Redis through fault proxies
// of its own.
func (c *Cluster) startAgent(
	ctx context.Context,
	bins Binaries,
	i int,
	region string,
	j int,
	addrs []string,
	redisArg map[string]string,
) (*AgentProcess, error) {
	o := c.Opts
	a := &AgentProcess{Region: region}
	var via []string
	for _, addr := range addrs {
		px, err := faultproxy.Start(addr)
		if err != nil {
			return nil, err
		}
		a.ToCoord = append(a.ToCoord, px)
		via = append(via, px.Addr)
	}
	toRedis, ok := redisArg[region]
	if !ok {
		var err error
		if a.ToRedis, err = faultproxy.Start(c.Redis[i].Addr); err != nil {
			return nil, err
		}
		toRedis = a.ToRedis.Addr
	}
	name, instance := "agent-"+region, region+"-"+strconv.Itoa(j)
	if j > 1 {
		name = "agent-" + instance
	}
	var grpcAddr, httpAddr string
	p, err := c.startServing(ctx, name, bins.Agent, func() ([]string, error) {
		grpcAddr, _ = c.freeAddr()
		httpAddr, _ = c.freeAddr()
		return append([]string{"serve", "--region", region, "--instance", instance,
			"--redis", toRedis, "--coordinator", strings.Join(via, ","), "--grpc-listen", grpcAddr,
			"--http-listen", httpAddr, "--check-timeout", o.CheckTimeout.String(),
			"--lease-margin", "50ms", "--log-level", "info",
			"--coordinator-hints=false", // reach the coordinators only through the fault proxies
			"--coordinator-tls-ca", c.pki.ca.CertFile,
			"--tls-cert", c.pki.regions[region].Cert, "--tls-key", c.pki.regions[region].Key,
			"--tls-client-ca", c.pki.ca.CertFile}, o.AgentArgs...), nil
	})
	if err != nil {
		return nil, err
	}
	p.Addr, a.Process, a.HTTP, a.web = grpcAddr, p, "https://"+httpAddr, c.web
	service, err := grpcCreds(c.pki.service)
	if err != nil {
		return nil, err
	}
	if a.checkCon, err = grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(service)); err != nil {
		return nil, err
	}
	a.Check = pb.NewCheckServiceClient(a.checkCon)
	return a, nil
}

// RegionAgents are region's agent processes, in Cluster.Agents' order.
func (c *Cluster) RegionAgents(region string) []*AgentProcess {
	var out []*AgentProcess
	for _, a := range c.Agents {
		if a.Region == region {
			out = append(out, a)
		}
	}
	return out
}

// Admin calls the leader's admin API.
func (c *Cluster) Admin(ctx context.Context, fn func(pb.AdminServiceClient, ...grpc.CallOption) error) error {
	return c.admin.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return fn(pb.NewAdminServiceClient(cc), opts...)
	})
}

// SetPolicies stores policies (quota-lease YAML, or an envoyproxy/ratelimit
// configuration) and waits until every agent knows them and is ready.
func (c *Cluster) SetPolicies(ctx context.Context, yaml string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Admin(ctx, func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
		_, err := a.SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: yaml}, opts...)
		return err
	}); err != nil {
		return fmt.Errorf("set policies: %w", err)
	}
	for _, a := range c.Agents {
		if err := a.WaitKnows(ctx, yaml); err != nil {
			return err
		}
	}
	return nil
}

// WaitKnows waits until the agent is ready and knows every policy of yaml
// (quota-lease YAML or an envoyproxy/ratelimit configuration), or ctx ends:
// after SetPolicies, or after the agent was restarted.
func (a *AgentProcess) WaitKnows(ctx context.Context, yaml string) error {
	ps, err := policy.ParsePolicyFile([]byte(yaml))
	if err != nil {
		return err
	}
	for !a.knows(ctx, ps) {
		if ctx.Err() != nil {
			return fmt.Errorf("agent %s does not know the policies; see %s", a.Region, filepath.Join(a.dir, a.Name+".log"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// knows reports whether the agent is ready and knows every policy: a probe
// check without attributes is refused for the missing identity (the policy
// is known) rather than for an unknown policy, and charges nothing.
func (a *AgentProcess) knows(ctx context.Context, ps []*policy.Policy) bool {
	resp, err := a.web.Get(a.HTTP + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return false
	}
	for _, p := range ps {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := a.Check.Check(cctx, &pb.CheckRequest{Policy: p.Name})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "needs attribute") {
			return false
		}
	}
	return true
}

// Leader returns the coordinator process that leads now, or nil.
func (c *Cluster) Leader(ctx context.Context) *Process {
	for _, p := range c.Coords {
		if !p.Alive() {
			continue
		}
		cc, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(c.adminCreds))
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = pb.NewAdminServiceClient(cc).ListLeases(cctx, &pb.ListLeasesRequest{})
		cancel()
		cc.Close()
		if err == nil {
			return p
		}
	}
	return nil
}

func (c *Cluster) waitLeader(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for c.Leader(ctx) == nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no coordinator leader within %s; see the logs in %s", limit, c.Dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// WaitLeader waits for a (new) leader.
func (c *Cluster) WaitLeader(ctx context.Context, limit time.Duration) (*Process, error) {
	if err := c.waitLeader(ctx, limit); err != nil {
		return nil, err
	}
	return c.Leader(ctx), nil
}

// Partition cuts region's agent off from every coordinator (or heals it).
func (a *AgentProcess) Partition(cut bool) {
	for _, px := range a.ToCoord {
		if cut {
			px.Cut()
		} else {
			px.Restore()
		}
	}
}

// Leases lists the leader's leases.
func (c *Cluster) Leases(ctx context.Context) ([]*pb.LeaseRecord, error) {
	var out []*pb.LeaseRecord
	err := c.Admin(ctx, func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
		resp, err := a.ListLeases(ctx, &pb.ListLeasesRequest{}, opts...)
		if err == nil {
			out = resp.Leases
		}
		return err
	})
	return out, err
}

// Stop stops every process, agents first, and every proxy.
func (c *Cluster) Stop() {
	for _, sv := range c.Services {
		sv.Stop()
		sv.Proxy.Close()
	}
	for _, a := range c.Agents {
		if a.checkCon != nil {
			a.checkCon.Close()
		}
		if a.Process != nil {
			a.Stop()
		}
		for _, px := range a.ToCoord {
			px.Close()
		}
		if a.ToRedis != nil {
			a.ToRedis.Close()
		}
	}
	for _, p := range c.Coords {
		p.Stop()
	}
	if c.Etcd != nil {
		c.Etcd.Stop()
	}
	if c.admin != nil {
		c.admin.Close()
	}
	for _, r := range c.Redis {
		if r != nil {
			r.Stop()
		}
	}
	for _, cl := range c.RedisClusters {
		cl.Stop()
	}
	for _, se := range c.Sentinels {
		se.Stop()
	}
}

// ServiceProcess is one process of examples/limited-service: an HTTP
// service that decides its requests in-process with package quotalease,
// streaming to its region's agent through a fault proxy of its own
// (cutting Proxy cuts its stream).
type ServiceProcess struct {
	*Process
	Region string
	URL    string
	Proxy  *faultproxy.Proxy
}
