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
	"fmt"
	"io"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/version"
)

func main() { cli.Main("quota-lease-demo", run) }

// run runs the demo and returns the process exit code: 0 on success (and
// for -h), 1 when the demo failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "version") {
		fmt.Fprintln(stdout, version.Get())
		return 0
	}
	return cli.Exit(stderr, "quota-lease-demo", runDemo(ctx, args, stdout, stderr))
}
