package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/netutil"
)

// The slowloris measurement (docs/benchmarks.md): good clients' HTTP
// checks over TLS with a client certificate, unloaded and then while a
// child process (this test binary, as TestSlowlorisAttacker) keeps 1,000
// connections without a certificate open to the agent, half sending
// nothing and half trickling a ClientHello a byte every 100 ms, each
// reconnecting when closed, from 24 loopback sources. It reports each
// client kind's p50 and p99, their ratio loaded to unloaded, and this
// process's most descriptors, goroutines and heap under the load (the
// attacker's own are in its process). "guarded" is the agent's listener
// (Agent.ListenHTTP); "unguarded" the one before it: net/http's
// ServeTLS on a LimitListener of 512 connections, handshaking in each
// connection's goroutine. Run it with
//
//	go test ./internal/agent/ -run '^$' -bench HTTPUnderSlowloris -benchtime 1x -v
func BenchmarkHTTPUnderSlowloris(b *testing.B) {
	for _, guarded := range []bool{true, false} {
		name := map[bool]string{true: "guarded", false: "unguarded"}[guarded]
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				measureSlowloris(b, guarded)
			}
		})
	}
}

// slowlorisConns is the attacker's connection count, slowlorisSources the
// loopback addresses they come from.
const slowlorisConns, slowlorisSources = 1000, 24

func measureSlowloris(b *testing.B, guarded bool) {
	ra := regionAgent(b, "name: api\nidentity: [tenant]\nlimit: 1000000\nperiod: 1s\nscope: region\n", nil)
	serverTLS, clientTLS := agentTLS(b)
	var addr string
	if guarded {
		addr = tlsAgentHTTP(b, ra, serverTLS, nil)
	} else {
		addr = unguardedAgentHTTP(b, ra, serverTLS)
	}
	clients := map[string]*http.Client{"keep-alive": certClient(b, clientTLS, true), "new-conn": certClient(b, clientTLS, false)}
	unloaded := map[string][]time.Duration{}
	for kind, c := range clients {
		unloaded[kind] = timedChecks(b, c, addr, 1000, 10*time.Second)
	}
	// The attack, from a process of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestSlowlorisAttacker$", "-test.timeout", "2m")
	cmd.Env = append(os.Environ(), "QL_SLOWLORIS_ADDR="+addr, "QL_SLOWLORIS_FOR=50s")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	time.Sleep(5 * time.Second) // the attack ramps up: its full weight, not an event, is what is measured
	var peak resourcePeak
	stop := peak.sample(ctx)
	loaded := map[string][]time.Duration{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for kind, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := timedChecks(b, c, addr, 5000, 12*time.Second) // four handshake deadlines: the attack's connections are closed and reopened
			mu.Lock()
			loaded[kind] = d
			mu.Unlock()
		}()
	}
	wg.Wait()
	stop()
	for _, kind := range []string{"keep-alive", "new-conn"} {
		u, l := quantiles(unloaded[kind]), quantiles(loaded[kind])
		b.Logf("%s: unloaded p50 %v p99 %v (%d checks); under %d slow connections p50 %v p99 %v (%d checks), p99 ratio %.2f",
			kind, u[0], u[1], len(unloaded[kind]), slowlorisConns, l[0], l[1], len(loaded[kind]), float64(l[1])/float64(u[1]))
		b.ReportMetric(float64(l[1])/float64(u[1]), kind+"-p99-ratio")
		b.ReportMetric(float64(l[1].Microseconds())/1000, kind+"-loaded-p99-ms")
	}
	fails := 0.0
	for _, r := range []string{"timeout", "error", "source-limit", "evicted"} {
		fails += counterValueLabeled(b, ra.a, "quotalease_agent_http_handshake_failures_total", "reason", r)
	}
	b.Logf("agent process under load: at most %d descriptors, %d goroutines, %.1f MiB heap in use; %v handshakes failed",
		peak.fds.Load(), peak.goroutines.Load(), float64(peak.heap.Load())/(1<<20), fails)
	b.ReportMetric(float64(peak.fds.Load()), "max-fds")
	b.ReportMetric(float64(peak.heap.Load())/(1<<20), "max-heap-MiB")
}

// unguardedAgentHTTP serves ra's HTTP API as the agent did before
// ListenHTTP (ServeTLS over a LimitListener of checkapi.DefaultMaxHTTPConns, the
// old timeouts and its cap of 512), for the comparison; net/http's own error lines are
// dropped (they were one per failed handshake).
func unguardedAgentHTTP(b *testing.B, ra *runningAgent, serverTLS *tls.Config) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: agentHandler(ra), TLSConfig: serverTLS.Clone(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(netutil.LimitListener(l, 512), "", "")
	b.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// timedChecks sends up to n checks one after another, for at most limit,
// and returns their latencies; a failed check counts at the time it took.
func timedChecks(b *testing.B, c *http.Client, addr string, n int, limit time.Duration) []time.Duration {
	out := make([]time.Duration, 0, n)
	end := time.Now().Add(limit)
	for i := 0; i < n && time.Now().Before(end); i++ {
		t0 := time.Now()
		resp, err := c.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(`{"policy":"api","attributes":{"tenant":"good"}}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		out = append(out, time.Since(t0))
	}
	return out
}

// quantiles returns the p50 and p99 of ds.
func quantiles(ds []time.Duration) [2]time.Duration {
	if len(ds) == 0 {
		return [2]time.Duration{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return [2]time.Duration{s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]}
}

// resourcePeak keeps the most descriptors, goroutines and heap this
// process had, sampled every 100 ms.
type resourcePeak struct{ fds, goroutines, heap atomic.Int64 }

func (p *resourcePeak) sample(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if es, err := os.ReadDir("/proc/self/fd"); err == nil {
				p.fds.Store(max(p.fds.Load(), int64(len(es))))
			}
			p.goroutines.Store(max(p.goroutines.Load(), int64(runtime.NumGoroutine())))
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			p.heap.Store(max(p.heap.Load(), int64(ms.HeapInuse)))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

// TestSlowlorisAttacker is the slowloris measurement's attacker, run as a
// child process by BenchmarkHTTPUnderSlowloris (skipped otherwise): it
// keeps slowlorisConns connections to QL_SLOWLORIS_ADDR open for
// QL_SLOWLORIS_FOR, reconnecting each one the agent closes, and exits.
func TestSlowlorisAttacker(t *testing.T) {
	addr := os.Getenv("QL_SLOWLORIS_ADDR")
	if addr == "" {
		t.Skip("the slowloris measurement's attacker process (BenchmarkHTTPUnderSlowloris)")
	}
	d, err := time.ParseDuration(os.Getenv("QL_SLOWLORIS_FOR"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var dials atomic.Int64
	for i := 0; i < slowlorisConns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := net.IPv4(127, 0, 3, byte(1+i%slowlorisSources))
			for ctx.Err() == nil {
				dials.Add(1)
				slowConn(ctx, addr, src, i%2 == 1)
			}
		}()
	}
	wg.Wait()
	fmt.Fprintln(os.Stderr, "slowloris attacker: "+strconv.FormatInt(dials.Load(), 10)+" connections made")
}

// slowConn holds one connection from src until the server closes it or
// ctx ends: sending nothing, or trickling a ClientHello a byte every
// 100 ms. A failed dial waits 100 ms.
func slowConn(ctx context.Context, addr string, src net.IP, trickle bool) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		return
	}
	defer c.Close()
	closed := make(chan struct{})
	go func() { io.Copy(io.Discard, c); close(closed) }()
	hello := []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if trickle {
			if _, err := c.Write(hello[i%len(hello) : i%len(hello)+1]); err != nil {
				return
			}
		}
	}
}
