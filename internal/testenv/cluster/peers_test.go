package cluster

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// peerConfig is one envoyproxy/ratelimit configuration both systems load:
// a limit per tenant, high enough that those loads measure deciding, not
// rejecting, and one low limit for the hot rejected key.
const peerConfig = `domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000}
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 10}
`

// peerLoad is one load both systems get in turn.
type peerLoad struct {
	name string
	// descriptors per call, each a different tenant of 10,000; hot: one
	// descriptor, always the same over-limit key; http: over each
	// system's HTTP API (/v1/check, /json) instead of gRPC.
	descriptors int
	hot, http   bool
	// algorithm, when set, is one quota-lease offers beyond the original's
	// fixed window: the load goes to quota-lease alone, to the domain
	// whose per-tenant limit uses it (oursPolicies).
	algorithm policy.Algorithm
}

var peerLoads = []peerLoad{
	{name: "HTTP, 1 descriptor", descriptors: 1, http: true},
	{name: "1 descriptor", descriptors: 1},
	{name: "16 descriptors", descriptors: 16},
	{name: "hot rejected key", descriptors: 1, hot: true},
	{name: "16 descriptors, token bucket", descriptors: 16, algorithm: policy.TokenBucket},
	{name: "16 descriptors, sliding window", descriptors: 16, algorithm: policy.SlidingWindow},
	{name: "16 descriptors, sliding log", descriptors: 16, algorithm: policy.SlidingLog},
}

// domain is the Envoy domain of l's calls.
func (l peerLoad) domain() string {
	if l.algorithm != "" {
		return "bench-" + string(l.algorithm)
	}
	return "bench"
}

// oursPolicies are the policies the agent loads: peerConfig's, as it
// loads that file unchanged (plus scope: region, for one agent), and the
// per-tenant limit once more for every other algorithm, each in a domain
// of its own (peerLoad.domain). The sliding log keeps one entry per
// admitted request, so its limit is at most 10,000: still far above what
// a tenant gets here.
func oursPolicies(b *testing.B) []byte {
	ps, err := policy.ParsePolicyFile([]byte(peerConfig + "scope: region\n"))
	if err != nil {
		b.Fatal(err)
	}
	var out []byte
	for _, alg := range []policy.Algorithm{"", policy.TokenBucket, policy.SlidingWindow, policy.SlidingLog} {
		for _, p := range ps {
			if alg != "" {
				if p.Envoy.Entries[0].Key != "tenant" {
					continue
				}
				q, m := *p, *p.Envoy
				q.Algorithm, q.Envoy, m.Domain = alg, &m, peerLoad{algorithm: alg}.domain()
				q.Name, q.Burst = p.Name+"-"+string(alg), 0
				if alg == policy.SlidingLog {
					q.Limit = min(q.Limit, 10_000)
				}
				p = &q
			}
			y, err := yaml.Marshal(p)
			if err != nil {
				b.Fatal(err)
			}
			out = append(append(out, "---\n"...), y...)
		}
	}
	return out
}

// request is the i-th call of l.
func (l peerLoad) request(i int) *rlsv3.RateLimitRequest {
	entry := func(k, v string) *commonrl.RateLimitDescriptor {
		return &commonrl.RateLimitDescriptor{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	if l.hot {
		return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonrl.RateLimitDescriptor{entry("hot", "abuser")}}
	}
	r := &rlsv3.RateLimitRequest{Domain: l.domain()}
	for k := range l.descriptors {
		r.Descriptors = append(r.Descriptors, entry("tenant", fmt.Sprint("t", (i*l.descriptors+k)%10000)))
	}
	return r
}

// peerRun is one system's measured round of one load.
type peerRun struct {
	lat      []time.Duration // every call's latency
	dur      time.Duration
	cpu      time.Duration // the server's and its Redis's CPU time in the round
	redisCPU time.Duration // of which its Redis's
	callers  time.Duration // the CPU time of this process, the callers, meanwhile
	local    float64       // decisions the server made without Redis (its local fallback)
}

// peerSystem is one system under test: its gRPC client, its HTTP check
// (URL and the body of the i-th call), and the server's and its Redis's
// process IDs for CPU accounting (the server's, then its Redis's).
type peerSystem struct {
	name     string
	client   rlsv3.RateLimitServiceClient
	web      *http.Client
	httpURL  string
	httpBody func(i int) string
	pids     []int
	// local, when set, counts the decisions the server made so far
	// without Redis.
	local func() float64
}

// call makes the i-th call of l to s.
func (s *peerSystem) call(ctx context.Context, l peerLoad, i int) error {
	if !l.http {
		_, err := s.client.ShouldRateLimit(ctx, l.request(i))
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.httpURL, strings.NewReader(s.httpBody(i)))
	if err != nil {
		return err
	}
	resp, err := s.web.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A rejection is a decision too, as an OVER_LIMIT answer over gRPC is
	// (under this load, a check past the agent's timeout is decided by its
	// local fallback, which may reject).
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return fmt.Errorf("%s: HTTP %d", s.httpURL, resp.StatusCode)
	}
	return nil
}

// startProcess starts bin with args and env added to this process's,
// logging to dir/name.log, in a process group killed at the end of b; it
// returns the process ID.
func startProcess(b *testing.B, dir, name string, env []string, bin string, args ...string) int {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = append(os.Environ(), env...), log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait(); log.Close() })
	return cmd.Process.Pid
}

// startRatelimit starts envoyproxy/ratelimit (bin) with its own
// redis-server and configuration cfg, stopped at the end of b; it returns
// its gRPC and HTTP addresses, and its and its Redis's process IDs.
func startRatelimit(b *testing.B, dir, bin, cfg string) (grpcAddr, httpAddr string, pids []int) {
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(cfg), 0o644); err != nil {
		b.Fatal(err)
	}
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	rs := redistest.Start(b)
	grpcAddr, httpAddr, debug := testenv.FreeAddr(b), testenv.FreeAddr(b), testenv.FreeAddr(b)
	pid := startProcess(b, dir, "ratelimit", []string{"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rs.Addr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT=" + port(httpAddr), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(grpcAddr),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(debug)}, bin)
	return grpcAddr, httpAddr, []int{pid, rs.Pid()}
}

// peerRatelimit is the envoyproxy/ratelimit binary (its service_cmd) the
// peer benchmarks run, from QUOTALEASE_PEER_RATELIMIT: without it, as
// under -short, they skip.
func peerRatelimit(b *testing.B) string {
	b.Helper()
	testenv.SkipMultiProcess(b)
	bin := os.Getenv("QUOTALEASE_PEER_RATELIMIT")
	if bin == "" {
		b.Skip("set QUOTALEASE_PEER_RATELIMIT to envoyproxy/ratelimit's service_cmd (make bench-peers does)")
	}
	return bin
}

// BenchmarkEnvoyAPIPeers measures Envoy's ShouldRateLimit against the
// agent and against envoyproxy/ratelimit side by side in one run, each
// with its own redis-server, the same configuration and the same loads
// (peerLoads) from 16 closed-loop callers. The systems alternate in rounds
// (A B A B), so the machine's drift hits both; read the ratios. It prints
// one table: calls and decisions per second, p50, p99 and p99.9, the CPU
// time per decision of the server and its Redis together, of its Redis
// alone and of the callers (this process), all from /proc, and the share
// of decisions the agent made without Redis; then the Redis CPU per
// decision of every algorithm quota-lease offers beside the original's
// fixed window. `make bench-peers` builds envoyproxy/ratelimit and runs
// this; without it (QUOTALEASE_PEER_RATELIMIT unset) it is skipped.
func BenchmarkEnvoyAPIPeers(b *testing.B) {
	peerBin := peerRatelimit(b)
	dir := b.TempDir()
	ours := filepath.Join(dir, "ours.yaml")
	if err := os.WriteFile(ours, oursPolicies(b), 0o644); err != nil {
		b.Fatal(err)
	}
	redisOurs := redistest.Start(b)
	agentAddr, agentHTTP := testenv.FreeAddr(b), testenv.FreeAddr(b)
	// A check timeout long enough that every decision is Redis's, as every
	// decision of envoyproxy/ratelimit is: with the agent's default 20 ms,
	// checks queued on these 2 shared cores time out, the breaker opens and
	// the local fallback decides (and rejects) without Redis. The table
	// counts what the agent still decided locally. QUOTALEASE_PEER_CHECK_TIMEOUT
	// sets another.
	checkTimeout := cmp.Or(os.Getenv("QUOTALEASE_PEER_CHECK_TIMEOUT"), "1s")
	agentPid := startProcess(b, dir, "agent", nil, bins.Agent, "serve", "--region", "bench", "--policies", ours, "--redis", redisOurs.Addr,
		"--grpc-listen", agentAddr, "--http-listen", agentHTTP, "--coordinator", "127.0.0.1:1", "--log-level", "warn",
		"--check-timeout", checkTimeout)
	// The HTTP API names the policy and its attribute as the agent derives
	// them from the Envoy configuration.
	ps, err := policy.ParsePolicyFile([]byte(peerConfig))
	if err != nil || len(ps) == 0 {
		b.Fatalf("peer configuration: %v", err)
	}
	tenant := ps[0]
	peerAddr, peerHTTP, peerPids := startRatelimit(b, dir, peerBin, peerConfig)

	web := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	b.Cleanup(web.CloseIdleConnections)
	systems := []*peerSystem{
		{name: "quota-lease", pids: []int{agentPid, redisOurs.Pid()}, web: web, httpURL: "http://" + agentHTTP + "/v1/check",
			httpBody: func(i int) string {
				return fmt.Sprintf(`{"policy":%q,"attributes":{%q:"t%d"}}`, tenant.Name, tenant.Identity[0], i%10000)
			},
			local: func() float64 { return localDecisions(b, web, "http://"+agentHTTP+"/metrics") }},
		{name: "envoyproxy/ratelimit", pids: peerPids, web: web, httpURL: "http://" + peerHTTP + "/json",
			httpBody: func(i int) string {
				return fmt.Sprintf(`{"domain":"bench","descriptors":[{"entries":[{"key":"tenant","value":"t%d"}]}]}`, i%10000)
			}},
	}
	for i, s := range systems {
		addr := []string{agentAddr, peerAddr}[i]
		s.client = rlsv3.NewRateLimitServiceClient(dial(b, addr, mtls.Files{}))
		poll(b, 30*time.Second, 100*time.Millisecond, func() error {
			if err := s.call(b.Context(), peerLoad{descriptors: 1, http: true}, 0); err != nil {
				return fmt.Errorf("%s's HTTP API not answering: %v (logs in %s)", s.name, err, dir)
			}
			if err := answersLimit(b.Context(), s.client); err != nil {
				return fmt.Errorf("%s %v (logs in %s)", s.name, err, dir)
			}
			return nil
		})
		// Both must reject the hot key once it is over its limit, or that
		// load would compare admitting with rejecting.
		hot := peerLoad{hot: true}.request(0)
		for n := 0; ; n++ {
			resp, err := s.client.ShouldRateLimit(b.Context(), hot)
			if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				break
			}
			if n > 100 {
				b.Fatalf("%s does not reject the hot key after 100 calls: %v %v", s.name, resp, err)
			}
		}
	}
	const rounds, callers, roundDur = 3, 16, 3 * time.Second
	runs := map[[2]int][]peerRun{} // load, system
	for b.Loop() {
		for li, l := range peerLoads {
			for range rounds {
				for si, s := range systems {
					if si > 0 && l.algorithm != "" {
						continue // the original has fixed windows only
					}
					runs[[2]int{li, si}] = append(runs[[2]int{li, si}], peerRound(b, s, l, callers, roundDur))
				}
			}
		}
	}
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tsystem\tcalls/s\tdecisions/s\tp50\tp99\tp99.9\tCPU µs/decision\tof which Redis\tcallers' CPU µs/decision\tdecided without Redis\t")
	redisPer := map[string][2]float64{} // load name -> Redis µs per decision, by system
	for li, l := range peerLoads {
		var rate, cpu, rcpu [2]float64
		for si, s := range systems {
			if si > 0 && l.algorithm != "" {
				continue
			}
			var lat []time.Duration
			var d, c, rc, cc time.Duration
			var local float64
			for _, r := range runs[[2]int{li, si}] {
				lat, d, c, rc, cc, local = append(lat, r.lat...), d+r.dur, c+r.cpu, rc+r.redisCPU, cc+r.callers, local+r.local
			}
			slices.Sort(lat)
			q := func(p float64) string {
				if len(lat) == 0 {
					return "-"
				}
				return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(time.Microsecond).String()
			}
			decisions := float64(len(lat) * l.descriptors)
			rate[si], cpu[si] = decisions/d.Seconds(), float64(c.Microseconds())/max(1, decisions)
			rcpu[si] = float64(rc.Microseconds()) / max(1, decisions)
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f%%\t\n", l.name, s.name, float64(len(lat))/d.Seconds(), rate[si],
				q(.5), q(.99), q(.999), cpu[si], rcpu[si], float64(cc.Microseconds())/max(1, decisions), 100*local/max(1, decisions))
			b.ReportMetric(rate[si], strings.ReplaceAll(s.name+"/"+l.name, " ", "-")+"-decisions/s")
		}
		redisPer[l.name] = rcpu
		if l.algorithm == "" {
			fmt.Fprintf(tw, "%s\tratio\t\t%.2f×\t\t\t\t%.2f×\t%.2f×\t\t\t\n", l.name, rate[0]/rate[1], cpu[0]/cpu[1], rcpu[0]/rcpu[1])
		}
	}
	tw.Flush()
	// Redis CPU per decision of every algorithm quota-lease offers, at 16
	// descriptors per call, beside the original's fixed window in the same
	// run.
	orig := redisPer["16 descriptors"][1]
	fmt.Fprintf(&out, "\nRedis CPU µs per decision, 16 descriptors per call (envoyproxy/ratelimit, fixed window: %.1f):\n", orig)
	tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tquota-lease\tratio to the original's fixed window\t")
	for _, l := range peerLoads {
		if l.descriptors != 16 {
			continue
		}
		alg := l.algorithm
		if alg == "" {
			alg = policy.FixedWindow
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f×\t\n", alg, redisPer[l.name][0], redisPer[l.name][0]/max(orig, 1e-9))
		b.ReportMetric(redisPer[l.name][0], "quota-lease/redis-µs/"+string(alg))
	}
	tw.Flush()
	b.Logf("%d rounds of %v per load and system, interleaved, %d callers, the agent's check timeout %s:\n%s", rounds, roundDur, callers, checkTimeout, out.String())
}

// peerRound runs callers closed loops of load l against s for d and
// measures them, with the CPU time s's processes spent meanwhile.
//
// A caller starts no call after d, and lets the one in flight finish: a
// call cancelled at the round's end would be an error to the server (the
// agent counts it as a failure of Redis, and enough in a row open its
// breaker into the next round), and would not be counted here.
func peerRound(b *testing.B, s *peerSystem, l peerLoad, callers int, d time.Duration) peerRun {
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	var local0 float64
	if s.local != nil {
		local0 = s.local()
	}
	server0, redis0, callers0 := processCPU(b, s.pids[:1]), processCPU(b, s.pids[1:]), processCPU(b, []int{os.Getpid()})
	t0 := time.Now()
	end := t0.Add(d)
	lat := gather(callers, func(g int) []time.Duration {
		var mine []time.Duration
		for i := g; time.Now().Before(end) && len(mine) < 2_000_000; i += callers {
			st := time.Now()
			if err := s.call(ctx, l, i); err != nil {
				b.Error(err)
				break
			}
			mine = append(mine, time.Since(st))
		}
		return mine
	})
	server, redis := processCPU(b, s.pids[:1])-server0, processCPU(b, s.pids[1:])-redis0
	run := peerRun{lat: lat, dur: time.Since(t0), cpu: server + redis, redisCPU: redis, callers: processCPU(b, []int{os.Getpid()}) - callers0}
	if s.local != nil {
		run.local = s.local() - local0
	}
	return run
}

// localDecisions sums the agent's decisions made by its local fallback so
// far (quotalease_agent_decisions_total{mode="local-fallback"}), from its
// metrics at url.
func localDecisions(b *testing.B, web *http.Client, url string) float64 {
	var n float64
	for _, s := range scrape(b, web, url) {
		if s.name == "quotalease_agent_decisions_total" && strings.Contains(s.labels, `mode="local-fallback"`) {
			n += s.value
		}
	}
	return n
}

// processCPU is the user and system CPU time the processes used so far
// (/proc/PID/stat, in clock ticks of 1/100 s, Linux's USER_HZ).
func processCPU(b testing.TB, pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatal(err)
		}
		// The command name (field 2) is in parentheses and may hold spaces:
		// count fields after its closing one. utime and stime are fields 14, 15.
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
		for _, v := range f[11:13] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("/proc/%d/stat: %v", pid, err)
			}
			total += time.Duration(n) * 10 * time.Millisecond
		}
	}
	return total
}
