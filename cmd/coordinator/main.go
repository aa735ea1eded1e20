// Command coordinator keeps the global quotas and hands regions leases on
// their shares (serve); its other subcommands are the SRE's tools, talking
// to a running coordinator's admin API.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/version"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"serve":              {"run a coordinator replica (embedded etcd by default)", runServe},
	"etcd":               {"run only an embedded etcd, for several local replicas to share", runEtcd},
	"certs":              {"make a development CA and every certificate a deployment needs", certsCmd},
	"certs issue":        {"issue one more certificate from that CA (per instance, rotation, --valid-for)", certsIssue},
	"quota set":          {"store the policies of a file (-f FILE)", quotaSet},
	"quota get":          {"print one stored policy", quotaGet},
	"quota list":         {"list the stored policies", quotaList},
	"quota delete":       {"delete a policy and its leases", quotaDelete},
	"quota validate":     {"check a policy file offline, changing nothing", quotaValidate},
	"leases":             {"list the regions' leases (--region R)", leasesList},
	"release":            {"drop a lapsed region's reserved degraded budget", release},
	"rebalance":          {"rebalance now, or pause/resume rebalancing", rebalance},
	"regions set-weight": {"declare a region or set its weight", regionsSetWeight},
	"regions list":       {"list the declared regions", regionsList},
	"bound":              {"print the overshoot bound of every quota, or one", boundCmd},
	"sim run":            {"run region-shift scenarios on virtual time (sim/scenarios/)", simRun},
}

func usage() string {
	var b strings.Builder
	b.WriteString("coordinator: global quotas and regional leases for quota-lease.\n\nUsage:\n  coordinator " +
		"<command> [flags]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-20s %s\n", n, commands[n].summary)
	}
	b.WriteString("\nAdmin commands reach the coordinator at --coordinator (default " +
		"$QUOTALEASE_COORDINATOR,\nor 127.0.0.1:7400) and print tables; -o json prints JSON for scripts.\nRun " +
		"'coordinator <command> -h' for a command's flags.\n")
	return b.String()
}

func main() { cli.Main("coordinator", run) }

// run executes one command and returns the exit code: 0 on success, 1 when
// the command failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage())
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Fprintln(stdout, version.Get())
		return 0
	}
	// A two-word command wins over a one-word one ("certs issue", "certs").
	var name string
	var rest []string
	var cmd command
	ok := false
	if len(args) > 1 {
		name, rest = args[0]+" "+args[1], args[2:]
		cmd, ok = commands[name]
	}
	if !ok {
		name, rest = args[0], args[1:]
		cmd, ok = commands[name]
	}
	if !ok {
		fmt.Fprintf(stderr, "coordinator: unknown command %q\n\n%s", strings.Join(args[:min(2, len(args))], " "), usage())
		return 2
	}
	return cli.Exit(stderr, "coordinator "+name, cmd.run(ctx, rest, stdout, stderr))
}

// newFlags returns a flag set for command name whose usage shows synopsis
// and description.
func newFlags(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	return cli.NewFlags(name, fmt.Sprintf("Usage: coordinator %s %s\n\n%s\n", name, synopsis, description), stderr)
}

// parse parses args, allowing flags before and after positional
// arguments (coordinator quota get NAME -o json), maps errors to cli.ErrUsage,
// and checks the number of positional arguments. The positional arguments
// are then fs.Args().
func parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if err == flag.ErrHelp {
				return err
			}
			return cli.ErrUsage
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if err := fs.Parse(append([]string{"--"}, positional...)); err != nil {
		return cli.ErrUsage
	}
	if fs.NArg() < minArgs || fs.NArg() > maxArgs {
		fs.Usage()
		return cli.ErrUsage
	}
	return nil
}
