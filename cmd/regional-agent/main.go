// Command regional-agent is the per-region daemon services call to ask
// "may this request go?". It decides against the region's Redis with the
// regional engine.
//
// Usage:
//
//	regional-agent serve --region R --redis ADDR --coordinator ADDR[,ADDR...] [flags]
//	regional-agent load --redis ADDR --policies FILE [flags]
package main

import (
	"context"
	"fmt"
	"io"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/version"
)

const usage = `regional-agent: the per-region rate-limit daemon of quota-lease.

Usage:
  regional-agent <command> [flags]

Commands:
  serve   run the agent: leases from the coordinator, checks over gRPC,
          Envoy's rate-limit API and HTTP, metrics and health
  load    drive traffic from many identities straight through the regional
          engine against one Redis and print what was admitted per policy

Run 'regional-agent <command> -h' for a command's flags. The local demo
(a whole deployment on loopback) is a command of its own: quota-lease-demo,
run by 'make demo'.
`

func main() { cli.Main("regional-agent", run) }

// run executes one command and returns the process exit code: 0 on
// success, 1 when the command failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "--version", "version":
		fmt.Fprintln(stdout, version.Get())
		return 0
	case "serve":
		err = runServe(ctx, args[1:], stderr)
	case "demo":
		fmt.Fprintln(stderr, "regional-agent: the demo is a command of its own now: run quota-lease-demo (or make demo)")
		return 2
	case "load":
		err = runLoad(ctx, args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "regional-agent: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	return cli.Exit(stderr, "regional-agent "+args[0], err)
}
