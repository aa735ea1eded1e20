package coordinator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quota-lease/quota-lease/internal/etcdembed"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// ownEtcd starts an etcd of the test's own (compaction and a full
// database would disturb the package's shared one) and a client of it.
func ownEtcd(t *testing.T, quota int64) *clientv3.Client {
	t.Helper()
	srv, err := etcdembed.Start(t.Context(), etcdembed.Config{Dir: t.TempDir(), QuotaBackendBytes: quota})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// The leader compacts etcd's history every interval up to the revision
// it read one interval earlier: what was written before is gone from the
// history, what is newer than an interval stays.
func TestCompactsEtcdHistory(t *testing.T) {
	cli := ownEtcd(t, 0)
	cfg := DefaultConfig()
	cfg.Name, cfg.Advertise, cfg.Regions, cfg.Timing = "c1", "127.0.0.1:1", []string{"us"}, testTiming
	cfg.CompactionInterval = 100 * time.Millisecond
	c, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	put, err := cli.Put(ctx, "/other/key", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/other/key", "v2"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "a compaction past the first write", func() bool { return c.compacted.Load() > put.Header.Revision })
	if _, err := cli.Get(ctx, "/other/key", clientv3.WithRev(put.Header.Revision)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("reading the compacted revision: %v, want ErrCompacted", err)
	}
	if got, err := cli.Get(ctx, "/other/key"); err != nil || string(got.Kvs[0].Value) != "v2" {
		t.Fatalf("the current value: %v %v", got, err)
	}
}

// An etcd whose database is full (its NOSPACE alarm raised) is named as
// such, with what to do, not as unreachable.
func TestNoSpaceSaysWhatToDo(t *testing.T) {
	cli := ownEtcd(t, 1<<20)
	big := strings.Repeat("x", 512<<10)
	// etcd counts a write against its quota once the backend committed the
	// ones before (every 100 ms): a fast machine writes 16 before then. So
	// write until refused, within a bound of writes and time.
	var err error
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < 1000 && err == nil && time.Now().Before(deadline); i++ {
		_, err = cli.Put(t.Context(), "/fill/"+string(rune('a'+i%16)), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 1 MiB etcd: %v, want NOSPACE", err)
	}
	msg := (&EtcdError{Op: "store policies", Endpoints: []string{"http://etcd:2379"}, Err: err}).Error()
	for _, want := range []string{"etcd is out of space", "NOSPACE", "etcdctl defrag", "alarm disarm", "docs/runbook.md"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
}
