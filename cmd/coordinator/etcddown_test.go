package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/etcdembed"
	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/faultproxy"
)

// etcdReplica is a `coordinator serve` run in-process against an external
// etcd, with its log.
type etcdReplica struct {
	addr, httpAddr string
	log            *testenv.SyncBuffer
}

// startReplica runs serve against the etcd at endpoint until the test
// ends, then stops it and waits for it to exit; a failed test logs what
// the replica logged, whichever wait failed.
func startReplica(t *testing.T, endpoint string) *etcdReplica {
	t.Helper()
	r := &etcdReplica{addr: testenv.FreeAddr(t), httpAddr: testenv.FreeAddr(t), log: &testenv.SyncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", r.addr, "--http-listen", r.httpAddr, "--etcd-endpoints", endpoint,
			"--etcd-timeout", "300ms", "--session-ttl", "1s", "--lease-duration", "2s", "--regions", "us,eu",
			"--prefix", "/" + strings.ReplaceAll(t.Name(), "/", "-")}, io.Discard, r.log)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("serve did not stop within 20 s")
		}
		if t.Failed() {
			t.Logf("coordinator log:\n%s", r.log.String())
		}
	})
	return r
}

// readyz returns the replica's /readyz status and body.
func (r *etcdReplica) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.httpAddr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkEtcdNamed requires the log, /readyz and the admin commands to say
// that etcd at endpoint is the trouble, plainly.
func (r *etcdReplica) checkEtcdNamed(t *testing.T, endpoint string, cli ...[]string) {
	t.Helper()
	host := strings.TrimPrefix(endpoint, "http://")
	testenv.WaitFor(t, 10*time.Second, "a log line naming etcd, its endpoint and what to do", func() bool {
		l := r.log.String()
		return strings.Contains(l, "[ERROR] coordinator: etcd calls failing") && strings.Contains(l, host) && strings.Contains(l, "check that etcd runs")
	})
	var code int
	var body string
	testenv.WaitFor(t, 10*time.Second, "/readyz naming etcd", func() bool {
		code, body = r.readyz(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd unreachable at "+endpoint)
	})
	for _, args := range cli {
		code, out, errs := runCmd(t, append(args, "--coordinator", r.addr, "--timeout", "1s")...)
		if code != 1 || !strings.Contains(errs, "etcd unreachable at "+endpoint) || strings.Contains(errs, "rpc error") || strings.Contains(errs, "RST_STREAM") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and a plain error naming etcd at %s", args, code, out, errs, endpoint)
		}
	}
	if testing.Verbose() && !t.Failed() { // a failed test logs it at its end (startReplica)
		t.Logf("coordinator log:\n%s", r.log.String())
	}
}

// A coordinator whose etcd does not exist says so within its etcd
// timeout: in its log (an error naming etcd, the endpoints and what to
// do), on /readyz and in every admin command's error, instead of logging
// "serving" and nothing more while the CLI shows a gRPC deadline.
func TestEtcdUnreachableAtStartIsNamed(t *testing.T) {
	t.Parallel()
	endpoint := "http://" + testenv.FreeAddr(t)
	r := startReplica(t, endpoint)
	r.checkEtcdNamed(t, endpoint, []string{"quota", "list"}, []string{"leases"}, []string{"quota", "get", "api"}, []string{"regions", "list"})
	if n := strings.Count(r.log.String(), "etcd calls failing"); n != 1 {
		t.Errorf("%d 'etcd calls failing' lines for one outage, want 1 (then one every 30 s)", n)
	}
}

// A leading coordinator cut off from its etcd notices within its
// session's keepalives and says so the same way; once etcd is reachable
// again the replica logs the recovery, leads again and is ready.
func TestEtcdLostLaterIsNamed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, stop, err := etcdembed.StartTemp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	px, err := faultproxy.Start(strings.TrimPrefix(srv.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	endpoint := "http://" + px.Addr
	r := startReplica(t, endpoint)
	testenv.WaitFor(t, 20*time.Second, "the replica to lead", func() bool { code, _ := r.readyz(t); return code == http.StatusOK })
	if code, _, errs := runCmd(t, "quota", "list", "--coordinator", r.addr); code != 0 {
		t.Fatalf("quota list with etcd up: exit %d: %s", code, errs)
	}
	px.Cut()
	r.checkEtcdNamed(t, endpoint, []string{"quota", "list"}, []string{"quota", "set", "-f", "../../examples/policies.yaml"})
	px.Restore()
	testenv.WaitFor(t, 20*time.Second, "the replica to lead again", func() bool { code, _ := r.readyz(t); return code == http.StatusOK })
	if !strings.Contains(r.log.String(), "etcd calls recovered") {
		t.Errorf("no recovery logged:\n%s", r.log.String())
	}
}
