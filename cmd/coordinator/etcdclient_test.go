package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/etcdembed"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// An etcd with TLS, client certificates and auth enabled is reached with
// the CA, a client certificate and a user whose password is in a file;
// without the password, or without TLS, it is not.
func TestEtcdTLSAndAuth(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.New(dir, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	scert, skey, err := ca.Issue(devca.Leaf{Name: "etcd-server"})
	if err != nil {
		t.Fatal(err)
	}
	ccert, ckey, err := ca.Issue(devca.Leaf{Name: "coordinator"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: filepath.Join(dir, "data"), CertFile: scert, KeyFile: skey, ClientCAFile: ca.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.Endpoint, "https://") {
		t.Fatalf("endpoint %s is not TLS", srv.Endpoint)
	}
	tlsFiles := mtls.Files{CA: ca.CertFile, Cert: ccert, Key: ckey}
	// Turn auth on: a root user.
	admin := &etcdAccess{tls: tlsFiles}
	acfg, err := admin.config([]string{srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	root.Close()

	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("rootpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A write that should work gets a generous deadline (etcd checks a
	// password with bcrypt, slow under -race); one that should fail, a
	// short one.
	try := func(a *etcdAccess, limit time.Duration) error {
		cfg, err := a.config([]string{srv.Endpoint})
		if err != nil {
			return err
		}
		cfg.DialTimeout = limit
		cli, err := clientv3.New(cfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		cctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		_, err = cli.Put(cctx, "/probe", "x")
		return err
	}
	if err := try(&etcdAccess{tls: tlsFiles, user: "root", passwordFile: pwFile}, 30*time.Second); err != nil {
		t.Fatalf("with TLS, certificate and password: %v", err)
	}
	if err := try(&etcdAccess{tls: tlsFiles}, 3*time.Second); err == nil {
		t.Fatal("without credentials etcd let a write through")
	}
	if err := try(&etcdAccess{user: "root", passwordFile: pwFile}, 3*time.Second); err == nil {
		t.Fatal("without TLS etcd answered")
	}
	if _, err := (&etcdAccess{user: "root"}).config(nil); err == nil || !strings.Contains(err.Error(), "QUOTALEASE_ETCD_PASSWORD") {
		t.Fatalf("a user without a password: %v", err)
	}
}
