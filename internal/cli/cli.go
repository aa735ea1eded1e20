// Package cli is what the quota-lease binaries share of a command line:
// the process's main (signals, gRPC's own log lines), a command's flag set
// and its -h (NewFlags: descriptions wrapped to a terminal's width), the
// usage error, the exit code of a command's error, and the debug listener
// (Debug) that serves the runtime profiles.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/logs"
)

// ErrUsage marks an error the flag set already explained to the user: the
// exit code is 2 and nothing more is printed.
var ErrUsage = errors.New("usage error")

// Main runs run with the process's arguments, on a context that SIGINT
// and SIGTERM cancel, and exits with the code it returns. gRPC's own log
// lines go through an hclog logger named name (warnings and errors, as
// JSON when --log-json is among the arguments): gRPC's logger must be set
// before any gRPC activity, so here and not in the commands, which tests
// run in-process.
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	logs.RouteGRPC(hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: os.Stderr,
		JSONFormat: slices.Contains(os.Args, "--log-json")}))
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit is the exit code of command what ("regional-agent serve") having
// returned err: 0 for none, or for -h; 2 for a usage error (ErrUsage);
// else 1, with the error printed after what.
func Exit(stderr io.Writer, what string, err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", what, err)
		return 1
	}
}
