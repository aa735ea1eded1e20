package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/etcdembed"
)

func runEtcd(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlags("etcd", "[--data-dir DIR] [--listen HOST:PORT]",
		`Runs only a single-node embedded etcd, for several coordinator replicas on
one machine (a laptop, the demo) to share with --etcd-endpoints. Production
uses a real etcd cluster instead. Stops on SIGINT or SIGTERM.`, stderr)
	dataDir := fs.String("data-dir", "etcd-data", "data directory")
	listen := fs.String("listen", "127.0.0.1:2379", "client address")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "etcd", Output: stderr})
	e, err := etcdembed.Start(ctx, etcdembed.Config{Dir: *dataDir, ClientAddr: *listen})
	if err != nil {
		return err
	}
	log.Info("serving", "endpoint", e.Endpoint, "data_dir", *dataDir)
	<-ctx.Done()
	e.Close()
	log.Info("stopped")
	return nil
}
