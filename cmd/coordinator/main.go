// Command coordinator keeps the global quotas and hands regions leases on
// their shares. Its subcommands are the SRE's tools.
//
// Usage:
//
//	coordinator quota validate -f policy.yaml [-o table|json]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/quota-lease/quota-lease/regional"
)

const usage = `coordinator: global quotas and regional leases for quota-lease.

Usage:
  coordinator <command> [subcommand] [flags]

Commands:
  quota validate -f FILE   check a policy file and print the policies it defines

Run 'coordinator <command> <subcommand> -h' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit code: 0 on success, 1 when
// the command failed, 2 on a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch strings.Join(args[:min(2, len(args))], " ") {
	case "quota validate":
		err = quotaValidate(args[2:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "coordinator: unknown command %q\n\n%s", strings.Join(args[:min(2, len(args))], " "), usage)
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "coordinator: %v\n", err)
		return 1
	}
}

var errUsage = errors.New("usage error")

func quotaValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("quota validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("f", "", "policy file (YAML, one policy per document); - reads standard input")
	output := fs.String("o", "table", "output format: table or json")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: coordinator quota validate -f FILE [-o table|json]\n\nParses and validates every policy in FILE without changing anything, and\nprints them with their defaults filled in. Exits 1 naming the first bad field.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return errUsage
	}
	if *file == "" || fs.NArg() > 0 || (*output != "table" && *output != "json") {
		fs.Usage()
		return errUsage
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, regional.MaxPolicyFileBytes+1))
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		return fmt.Errorf("read policy file: %w", err)
	}
	ps, err := regional.ParsePolicies(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ps)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tIDENTITY\tALGORITHM\tLIMIT\tPERIOD\tBURST\tSCOPE\tFAILURE")
	for _, p := range ps {
		burst := "-"
		if p.Algorithm == regional.TokenBucket {
			burst = fmt.Sprint(p.Burst)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%v\t%s\t%s\t%s\t%s\n", p.Name, p.Version, strings.Join(p.Identity, ","),
			p.Algorithm, p.Limit, p.Period, burst, p.Scope, p.Failure.Mode)
	}
	return tw.Flush()
}
