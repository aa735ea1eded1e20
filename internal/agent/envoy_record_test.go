package agent

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestRecordEnvoyOriginal records envoyproxy/ratelimit's answers to the
// parity cases (envoyParityCases) into testdata/envoy-original.json: it
// runs the real service (QUOTALEASE_RECORD_ENVOY_ORIGINAL, its service_cmd,
// as `make record-envoy-original` builds it at the pinned version) on its
// own redis-server with every case's configuration, makes each case's
// calls in order and writes what it answered. Skipped without it.
func TestRecordEnvoyOriginal(t *testing.T) {
	bin := os.Getenv("QUOTALEASE_RECORD_ENVOY_ORIGINAL")
	if bin == "" {
		t.Skip("set QUOTALEASE_RECORD_ENVOY_ORIGINAL to envoyproxy/ratelimit's service_cmd (make record-envoy-original does)")
	}
	cases := envoyParityCases()
	// One service per set of settings (they are process-wide), serving
	// the configurations of the cases that run with them.
	groups := map[string][]int{}
	var order []string
	for i, c := range cases {
		k := strings.Join(c.Settings, " ")
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	for _, k := range order {
		client := startOriginal(t, bin, cases, groups[k])
		for _, ci := range groups[k] {
			recordCase(t, client, &cases[ci])
		}
	}
	out, err := json.MarshalIndent(cases, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(envoyOriginalFile, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d cases from %s into %s", len(cases), strings.TrimSpace(bin), envoyOriginalFile)
}

// startOriginal runs envoyproxy/ratelimit (bin) on its own redis-server,
// with the settings and configurations of cases[idx], and returns a
// client once it is healthy.
func startOriginal(t *testing.T, bin string, cases []parityCase, idx []int) rlsv3.RateLimitServiceClient {
	t.Helper()
	dir := t.TempDir()
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, i := range idx {
		if err := os.WriteFile(filepath.Join(cfgDir, fmt.Sprintf("case%d.yaml", i)), []byte(cases[i].Config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, p, _ := net.SplitHostPort(l.Addr().String())
		return p
	}
	grpcPort, httpPort, debugPort := free(), free(), free()
	log, err := os.Create(filepath.Join(dir, "ratelimit.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+startRedis(t).Addr,
		"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=warn", "HOST=127.0.0.1", "PORT="+httpPort,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+debugPort)
	cmd.Env = append(cmd.Env, cases[idx[0]].Settings...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait(); log.Close() })
	// Ready when its health check passes (it loads the configuration
	// first); a probe call would charge a limit.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:" + httpPort + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("envoyproxy/ratelimit not healthy: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond) // polling a process's start-up
	}
	return rlsv3.NewRateLimitServiceClient(grpcConn(t, "127.0.0.1:"+grpcPort))
}

// recordCase makes c's calls in order and records the answers in c.
func recordCase(t *testing.T, client rlsv3.RateLimitServiceClient, c *parityCase) {
	t.Helper()
	for i := range c.Calls {
		call := &c.Calls[i]
		req := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(call.Request, req); err != nil {
			t.Fatal(err)
		}
		resp, err := client.ShouldRateLimit(t.Context(), req)
		if err != nil {
			st := status.Convert(err)
			call.Error = &parityError{Code: st.Code().String(), Message: st.Message()}
			continue
		}
		if call.Response, err = protojson.Marshal(resp); err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.Statuses {
			if d := s.DurationUntilReset; d != nil && d.Seconds < 10 {
				t.Fatalf("case %q: recorded %v before a window ends: record again", c.Name, d)
			}
		}
	}
}
