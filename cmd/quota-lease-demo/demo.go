package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
)

// demoUsage is what -h prints above the flags.
const demoUsage = `Usage: quota-lease-demo [flags]

Starts a whole deployment on loopback as real processes: an etcd, two
coordinator replicas, and three regions (us, eu, ap) each with its own
redis-server and agent. Loads three policies, drives region-shifting traffic
through the agents' gRPC API, and runs Envoy-like clients behind eu that
decide one policy themselves on token buckets eu's agent assigns them
(Envoy's Rate Limit Quota Service), and two Go services behind us that
decide it in-process with the client library (examples/limited-service);
kills the coordinator leader, cuts ap off from the coordinators for a
while, prints progress, then per policy a table per region (and eu's
Envoys, us's services) and in total against the limit and the bound, and
stops everything.
'make demo' builds the binaries and runs this (bin/quota-lease-demo --bin bin).
`

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("quota-lease-demo", demoUsage, stderr)
	exe, _ := os.Executable()
	bin := fs.String("bin", filepath.Dir(exe),
		"directory holding the coordinator, regional-agent and limited-service binaries")
	dur := fs.Duration("duration", time.Minute, "how long to send traffic (events are placed along it)")
	keep := fs.Bool("keep", false, "keep the work directory (data and logs of every process)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return cli.ErrUsage
	}
	bins := cluster.Binaries{Coordinator: filepath.Join(*bin, "coordinator"), Agent: filepath.Join(*bin, "regional-agent"),
		Service: filepath.Join(*bin, "limited-service")}
	for _, b := range []string{bins.Coordinator, bins.Agent, bins.Service} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s not found: run 'make build' (or pass --bin)", b)
		}
	}
	dir, err := os.MkdirTemp("", "quota-lease-demo-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	err = cluster.RunDemo(ctx, bins, dir, *dur, stdout)
	if *keep {
		fmt.Fprintf(stdout, "kept %s: every process's data and log (*.log)\n", dir)
	} else {
		fmt.Fprintln(stdout, "removed the work directory (keep it with --keep, or make demo KEEP=1)")
	}
	return err
}
