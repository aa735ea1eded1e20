package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/etcdembed"
)

// etcdEndpoint is the client URL of the etcd started by MainWithEtcd.
var etcdEndpoint string

// MainWithEtcd is the body of a TestMain for a package whose tests share
// one embedded etcd: it starts etcd in a temporary directory, runs the
// tests, stops etcd, removes the directory and exits with the tests'
// status. Tests reach etcd at EtcdEndpoint and keep apart by using their
// own key Prefix.
//
//	func TestMain(m *testing.M) { testenv.MainWithEtcd(m) }
func MainWithEtcd(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	srv, stop, err := etcdembed.StartTemp(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv: start etcd:", err)
		os.Exit(1)
	}
	etcdEndpoint = srv.Endpoint
	code := m.Run()
	stop()
	os.Exit(code)
}

// EtcdEndpoint returns the client URL of the etcd started by MainWithEtcd.
// It panics if the test binary's TestMain did not call MainWithEtcd.
func EtcdEndpoint() string {
	if etcdEndpoint == "" {
		panic("testenv: no etcd: TestMain must call testenv.MainWithEtcd")
	}
	return etcdEndpoint
}
