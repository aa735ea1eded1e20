package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
)

// The runbook's TLS deployment, run from its own text as a newcomer would:
// every block of docs/runbook.md marked `<!-- runbook-test: tls -->`, in
// order, in bash, in a fresh directory with freshly built binaries on
// PATH and the file names the runbook uses; only the ports are swapped for
// free ones. Processes a block starts in the background (`... &`) run on
// until the end, when the test stops them. The last block's check must be
// admitted and `coordinator leases` must show the agent.
func TestRunbookTLSDeployment(t *testing.T) {
	testenv.SkipMultiProcess(t)
	redisBin, err := redistest.Binary()
	if err != nil {
		t.Skipf("the runbook needs redis-server: %v", err)
	}
	for _, tool := range []string{"bash", "curl", "base64", "head"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the runbook needs %s: %v", tool, err)
		}
	}
	blocks := markedBlocks(t, "../docs/runbook.md", "tls")
	if len(blocks) < 5 {
		t.Fatalf("docs/runbook.md has %d blocks marked runbook-test: tls, want the whole deployment", len(blocks))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bins, err := cluster.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Dir(bins.Coordinator) + ":" + filepath.Dir(redisBin) + ":" + os.Getenv("PATH")
	sh := &shell{dir: t.TempDir(), env: cleanEnv(path)}
	t.Cleanup(func() { sh.stop(t) })
	ports := freePorts(t, "6379", "7400", "7401", "7500", "7501")
	var last string
	for i, b := range blocks {
		out, err := sh.run(ctx, i, withPorts(b, ports))
		if err != nil {
			sh.dumpLogs(t)
			t.Fatalf("runbook block %d failed: %v\n%s\n--- output:\n%s", i+1, err, b, out)
		}
		last = out
	}
	if !strings.Contains(last, `"allowed":true`) {
		sh.dumpLogs(t)
		t.Fatalf("the runbook's check was not admitted:\n%s", last)
	}
	if !regexp.MustCompile(`(?m)^api-per-tenant\s+us\s+us-a\s+active\s`).MatchString(last) {
		sh.dumpLogs(t)
		t.Fatalf("coordinator leases does not show agent us-a active:\n%s", last)
	}
}

// markedBlocks returns the fenced code blocks of the Markdown file path
// that follow a `<!-- runbook-test: name -->` line, in order.
func markedBlocks(t *testing.T, path, name string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?ms)^<!-- runbook-test: " + regexp.QuoteMeta(name) + " -->\\s*\n```[a-z]*\n(.*?)^```")
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		out = append(out, m[1])
	}
	return out
}

// freePorts maps each port the runbook names to a free one on loopback,
// all different: each is held open until all are picked (one picked and
// closed at a time could come twice, and did: the agent's HTTP port was the
// coordinator's). They are picked below the kernel's ephemeral range, from
// which a process binding port 0 is given one: the coordinator's embedded
// etcd does, and once took the agent's gRPC port between its pick and the
// agent's start.
func freePorts(t *testing.T, names ...string) map[string]string {
	t.Helper()
	low := 32768 // Linux's default ephemeral range starts here
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &low)
	}
	out := map[string]string{}
	for _, n := range names {
		for try := 0; out[n] == ""; try++ {
			if try == 100 {
				t.Fatalf("no free port below %d for the runbook's %s after 100 tries", low, n)
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(max(1, low-10000))))
			if err != nil {
				continue // taken
			}
			defer l.Close()
			_, out[n], _ = net.SplitHostPort(l.Addr().String())
		}
	}
	return out
}

// withPorts replaces the runbook's port numbers in block.
func withPorts(block string, ports map[string]string) string {
	return regexp.MustCompile(`\b\d{4}\b`).ReplaceAllStringFunc(block, func(p string) string {
		if to, ok := ports[p]; ok {
			return to
		}
		return p
	})
}

// cleanEnv is this process's environment without quota-lease's own
// variables (a newcomer's shell has none), with PATH set.
func cleanEnv(path string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUOTALEASE_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+path)
}

// shell runs blocks one after the other as a user's shell session would:
// in one directory, each block seeing the variables the ones before
// exported, and the processes they left in the background running on.
type shell struct {
	dir    string
	env    []string
	groups []int // process groups of the blocks, with their background processes
}

// run runs block i with bash (-e, -u, pipefail) and returns its output.
func (s *shell) run(ctx context.Context, i int, block string) (string, error) {
	envFile := filepath.Join(s.dir, fmt.Sprintf(".step-%d.env", i))
	script := filepath.Join(s.dir, fmt.Sprintf(".step-%d.sh", i))
	if err := os.WriteFile(script, []byte("set -euo pipefail\n"+block+"\nenv -0 > "+envFile+"\n"), 0o600); err != nil {
		return "", err
	}
	// Output to a file, not a pipe: the block's background processes keep
	// its descriptors open, and a pipe would make Wait wait for them.
	outFile := filepath.Join(s.dir, fmt.Sprintf(".step-%d.out", i))
	out, err := os.Create(outFile)
	if err != nil {
		return "", err
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.dir, s.env, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	s.groups = append(s.groups, cmd.Process.Pid)
	err = cmd.Wait()
	text, _ := os.ReadFile(outFile)
	if err != nil {
		return string(text), err
	}
	env, rerr := os.ReadFile(envFile)
	if rerr != nil {
		return string(text), rerr
	}
	s.env = nil
	for _, kv := range bytes.Split(env, []byte{0}) {
		if len(kv) > 0 {
			s.env = append(s.env, string(kv))
		}
	}
	return string(text), nil
}

// stop sends SIGTERM to every process the blocks started and waits until
// they are gone (SIGKILL after 20 s).
func (s *shell) stop(t *testing.T) {
	for _, g := range s.groups {
		_ = syscall.Kill(-g, syscall.SIGTERM)
	}
	gone := func() bool {
		for _, g := range s.groups {
			if err := syscall.Kill(-g, 0); !errors.Is(err, syscall.ESRCH) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for !gone() {
		if time.Now().After(deadline) {
			t.Errorf("the runbook's processes did not stop on SIGTERM within 20 s; killing them")
			for _, g := range s.groups {
				_ = syscall.Kill(-g, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dumpLogs logs the ends of the logs the runbook's processes write.
func (s *shell) dumpLogs(t *testing.T) {
	logs, _ := filepath.Glob(filepath.Join(s.dir, "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		if len(b) > 4000 {
			b = b[len(b)-4000:]
		}
		t.Logf("--- %s:\n%s", filepath.Base(f), b)
	}
}
