package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quota-lease/quota-lease/internal/mtls"
)

// etcdAccess is how the coordinator reaches an external etcd cluster:
// TLS files and a user whose password comes from a file or the
// environment, never from the command line (where ps would show it).
type etcdAccess struct {
	tls          mtls.Files
	user         string
	passwordFile string
}

func addEtcdAccessFlags(fs *flag.FlagSet) *etcdAccess {
	a := &etcdAccess{}
	fs.StringVar(&a.tls.CA, "etcd-cacert", "", "PEM CA of the etcd servers; turns TLS on toward etcd (https:// endpoints)")
	fs.StringVar(&a.tls.Cert, "etcd-cert", "", "PEM client certificate for etcd")
	fs.StringVar(&a.tls.Key, "etcd-key", "", "PEM key of --etcd-cert")
	fs.StringVar(&a.user, "etcd-user", "",
		"etcd user (with auth enabled); the password comes from --etcd-password-file or env "+
			"QUOTALEASE_ETCD_PASSWORD")
	fs.StringVar(&a.passwordFile, "etcd-password-file", "", "file holding --etcd-user's password")
	return a
}

// config returns the etcd client configuration for endpoints.
func (a *etcdAccess) config(endpoints []string) (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if a.tls.Enabled() {
		t, err := mtls.Client(a.tls, "")
		if err != nil {
			return cfg, fmt.Errorf("etcd TLS: %w (give --etcd-cacert)", err)
		}
		cfg.TLS = t
	}
	if a.user != "" {
		pw := os.Getenv("QUOTALEASE_ETCD_PASSWORD")
		if a.passwordFile != "" {
			b, err := os.ReadFile(a.passwordFile)
			if err != nil {
				return cfg, fmt.Errorf("--etcd-password-file: %w", err)
			}
			pw = strings.TrimRight(string(b), "\r\n")
		}
		if pw == "" {
			return cfg, fmt.Errorf("--etcd-user %s needs a password: --etcd-password-file or QUOTALEASE_ETCD_PASSWORD", a.user)
		}
		cfg.Username, cfg.Password = a.user, pw
	}
	return cfg, nil
}
