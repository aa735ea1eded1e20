package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/internal/redistest"
)

// peerConfig is one envoyproxy/ratelimit configuration both systems load:
// a limit per tenant, high enough that the load measures deciding, not
// rejecting.
const peerConfig = `domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000}
`

// peerRun is one system's measured round.
type peerRun struct {
	checks int
	p99    time.Duration
	dur    time.Duration
}

// BenchmarkEnvoyAPIPeers measures Envoy's ShouldRateLimit against the
// agent and against envoyproxy/ratelimit side by side in one run, each
// with its own redis-server, the same configuration and the same load:
// 16 closed-loop callers, one descriptor per call, tenants drawn from
// 10,000. The two alternate in rounds, so the machine's drift hits both;
// read the ratio. `make bench-peers` builds envoyproxy/ratelimit and runs
// this; without it (QUOTALEASE_PEER_RATELIMIT unset) it is skipped.
func BenchmarkEnvoyAPIPeers(b *testing.B) {
	peerBin := os.Getenv("QUOTALEASE_PEER_RATELIMIT")
	if peerBin == "" {
		b.Skip("set QUOTALEASE_PEER_RATELIMIT to envoyproxy/ratelimit's service_cmd (make bench-peers does)")
	}
	dir := b.TempDir()
	ours := filepath.Join(dir, "ours.yaml")
	if err := os.WriteFile(ours, []byte(peerConfig+"scope: region\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), []byte(peerConfig), 0o644); err != nil {
		b.Fatal(err)
	}
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	start := func(name string, env []string, bin string, args ...string) {
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
	}
	redisOurs, redisPeer := redistest.Start(b), redistest.Start(b)
	agentAddr := free()
	start("agent", nil, bins.Agent, "serve", "--region", "bench", "--policies", ours, "--redis", redisOurs.Addr,
		"--grpc-listen", agentAddr, "--http-listen", free(), "--coordinator", "127.0.0.1:1", "--log-level", "warn")
	peerAddr, peerHTTP, peerDebug := free(), free(), free()
	start("ratelimit", []string{"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisPeer.Addr,
		"RUNTIME_ROOT=" + filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT=" + port(peerHTTP), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(peerAddr),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(peerDebug)}, peerBin)

	systems := []struct{ name, addr string }{{"quota-lease", agentAddr}, {"envoyproxy/ratelimit", peerAddr}}
	clients := make([]rlsv3.RateLimitServiceClient, len(systems))
	for i, s := range systems {
		cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := clients[i].ShouldRateLimit(b.Context(), peerRequest(0))
			if err == nil && resp.Statuses[0].CurrentLimit != nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s not answering with the limit: %v %v (logs in %s)", s.name, resp, err, dir)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	const rounds, callers, roundDur = 3, 16, 3 * time.Second
	runs := make([][]peerRun, len(systems))
	for b.Loop() {
		for r := 0; r < rounds; r++ {
			for i := range systems {
				runs[i] = append(runs[i], peerRound(b, clients[i], callers, roundDur))
			}
		}
	}
	var rate [2]float64
	for i, s := range systems {
		var n int
		var d time.Duration
		var p99s []string
		for _, r := range runs[i] {
			n += r.checks
			d += r.dur
			p99s = append(p99s, r.p99.Round(10*time.Microsecond).String())
		}
		rate[i] = float64(n) / d.Seconds()
		b.Logf("%-22s %8.0f checks/s  p99 per round %s", s.name, rate[i], strings.Join(p99s, " "))
		b.ReportMetric(rate[i], strings.ReplaceAll(s.name, "/", "-")+"-checks/s")
	}
	b.ReportMetric(rate[0]/rate[1], "ratio")
}

func peerRequest(i int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonrl.RateLimitDescriptor{{
		Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "tenant", Value: fmt.Sprint("t", i%10000)}}}}}
}

// peerRound runs callers closed loops against c for d and measures them.
func peerRound(b *testing.B, c rlsv3.RateLimitServiceClient, callers int, d time.Duration) peerRun {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := g; ctx.Err() == nil && len(mine) < 2_000_000; i += callers {
				s := time.Now()
				if _, err := c.ShouldRateLimit(ctx, peerRequest(i)); err != nil {
					if !ending(ctx) {
						b.Error(err)
					}
					break
				}
				mine = append(mine, time.Since(s))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r := peerRun{checks: len(lat), dur: el}
	if len(lat) > 0 {
		r.p99 = lat[len(lat)*99/100]
	}
	return r
}
