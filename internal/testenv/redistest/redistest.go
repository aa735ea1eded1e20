// Package redistest starts throwaway redis-server processes for tests and
// demos: real Redis on a free loopback port, no persistence.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server owned by a test.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr  string
	cmd   *exec.Cmd
	bin   string
	dir   string
	conf  string   // a configuration file, first on the command line ("" for none)
	extra []string // more redis-server arguments
}

// Binary returns the path of redis-server, or an error telling how to
// install it.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found in PATH: run `make deps` (apt-get install -y " +
			"redis-server) or set REDIS_SERVER")
	}
	return p, nil
}

// Start runs a fresh redis-server for tb, with args added to its command
// line (e.g. "--requirepass", "secret"), and stops it when tb ends. A
// missing redis-server fails the test: claims about Redis are only proven
// against Redis.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s, err := start(tb.TempDir(), args...)
	if err != nil {
		tb.Fatalf("start redis: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartIn runs a fresh redis-server with its files in dir, for callers
// that are not tests (the demo); they must call Stop.
func StartIn(dir string) (*Server, error) { return start(dir) }

func start(dir string, args ...string) (*Server, error) { return startConf(dir, "", args...) }

// startConf is start with a configuration file (Sentinel needs one of its
// own, which it rewrites).
func startConf(dir, conf string, args ...string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir, conf: conf, extra: args}
		if lastErr = s.run(); lastErr == nil {
			return s, nil
		}
		s.Stop() // most likely the port was taken meanwhile: try another
	}
	return nil, fmt.Errorf("redis-server did not become ready: %w", lastErr)
}

// run starts the process on s.Addr and waits until it answers.
func (s *Server) run() error {
	_, port := splitAddr(s.Addr)
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args, "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"))
	cmd := exec.Command(s.bin, append(args, s.extra...)...)
	// Killed with this process, however it ends: no server outlives its test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	s.cmd = cmd
	return s.waitReady(5 * time.Second)
}

// Pid is the running redis-server's process ID (for CPU accounting).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Restart kills the server (SIGKILL, as a crash) and starts a new one on
// the same address: with no persistence it comes back empty, as a Redis
// restarted without its data or replaced by an empty replica.
func (s *Server) Restart() error {
	s.Stop()
	var err error
	for attempt := 0; attempt < 20; attempt++ { // the port may linger a moment
		if err = s.run(); err == nil {
			return nil
		}
		s.Stop()
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("restart redis on %s: %w", s.Addr, err)
}

func (s *Server) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || strings.Contains(err.Error(), "NOAUTH") { // up, and asks for a password
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Client returns a client of s closed at the end of tb.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Pause stops the server process (SIGSTOP): connections stay open and
// commands queue until Resume, as with a Redis stalled by a fork, a swap
// storm or a paused VM.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT); queued commands then run.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}

// Stop kills the server and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process would die only when continued
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// splitAddr splits a host:port this package made.
func splitAddr(addr string) (host, port string) {
	host, port, _ = net.SplitHostPort(addr)
	return host, port
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
