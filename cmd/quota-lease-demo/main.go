// Command quota-lease-demo runs a whole local quota-lease deployment on
// loopback as real processes, drives traffic through it while injecting
// faults, and prints what was admitted against the limit and the bound.
// 'make demo' builds the binaries and runs it.
//
// It is a command of its own, apart from regional-agent, so that the
// shipped agent does not link the multi-process test harness
// (internal/testenv).
//
// Usage:
//
//	quota-lease-demo [--bin DIR] [--duration 60s] [--keep]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// gRPC's logger must be set before any gRPC activity: warnings and
	// errors only.
	logs.RouteGRPC(hclog.New(&hclog.LoggerOptions{Name: "quota-lease-demo", Level: hclog.Warn, Output: os.Stderr}))
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the demo and returns the process exit code: 0 on success (and
// for -h), 1 when the demo failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Get())
		return 0
	}
	err := runDemo(ctx, args, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "quota-lease-demo: %v\n", err)
		return 1
	}
}

// errUsage marks an error already explained to the user by the flag set.
var errUsage = errors.New("usage error")
