package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/coordinator"
	"github.com/quota-lease/quota-lease/policy"
)

// readPolicyFile reads a policy file, or standard input for "-".
func readPolicyFile(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, policy.MaxPolicyFileBytes+1))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	return data, nil
}

func quotaValidate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("quota validate", "-f FILE [-o table|json]",
		"Parses and validates every policy in FILE without contacting anything, as\n'quota set' would (at most "+
			"100 policies per file), and prints them with their\ndefaults filled in. Exits 1 naming the first bad "+
			"field. Only the coordinator\nchecks floors against the declared regions and changes to stored "+
			"policies.", stderr)
	file := fs.String("f", "", "policy file (YAML, one policy per document); - reads standard input")
	output := fs.String("o", "table", "output format: table or json")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *file == "" || (*output != "table" && *output != "json") {
		fs.Usage()
		return cli.ErrUsage
	}
	data, err := readPolicyFile(*file)
	if err != nil {
		return err
	}
	ps, err := coordinator.ParsePolicySet(data) // the limits quota set applies
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	if *output == "json" {
		return writeJSON(stdout, ps)
	}
	return printPolicies(stdout, ps, nil)
}

// printPolicies prints ps as a table; sources, by policy name, says who
// manages those an xDS server manages (a SOURCE column, when any is).
func printPolicies(w io.Writer, ps []*policy.Policy, sources map[string]string) error {
	// Policies from an envoyproxy/ratelimit configuration also show the
	// descriptor they match, so both forms can be read side by side.
	// A SHARDS column appears when a policy splits its identities.
	envoy, sharded := false, false
	for _, p := range ps {
		envoy = envoy || p.Envoy != nil
		sharded = sharded || p.ShardCount() > 1
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "NAME\tVERSION\tIDENTITY\tALGORITHM\tLIMIT\tPERIOD\tBURST\tSCOPE\tFAILURE"
	if sharded {
		header += "\tSHARDS"
	}
	if envoy {
		header += "\tENVOY DESCRIPTOR"
	}
	if len(sources) > 0 {
		header += "\tSOURCE"
	}
	fmt.Fprintln(tw, header)
	for _, p := range ps {
		burst := "-"
		if p.Algorithm == policy.TokenBucket {
			burst = fmt.Sprint(p.Burst)
		}
		failure := string(p.Failure.Mode)
		if p.ShadowMode {
			failure += " (shadow)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%v\t%s\t%s\t%s\t%s", p.Name, p.Version, strings.Join(p.Identity, ","),
			p.Algorithm, p.Limit, p.Period, burst, p.Scope, failure)
		if sharded {
			fmt.Fprintf(tw, "\t%d", p.ShardCount())
		}
		if envoy {
			fmt.Fprintf(tw, "\t%s", envoyDescriptor(p.Envoy))
		}
		if len(sources) > 0 {
			src := sources[p.Name]
			if src == "" {
				src = "quota set"
			}
			fmt.Fprintf(tw, "\t%s", src)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// envoyDescriptor shows a policy's Envoy match as domain: key=value,key.
func envoyDescriptor(m *policy.EnvoyMatch) string {
	if m == nil {
		return "-"
	}
	var parts []string
	for _, e := range m.Entries {
		if e.Value != "" {
			parts = append(parts, e.Key+"="+e.Value)
		} else {
			parts = append(parts, e.Key)
		}
	}
	s := m.Domain + ": " + strings.Join(parts, ",")
	if m.Unlimited {
		s += " (unlimited)"
	}
	if len(m.Replaces) > 0 {
		s += " replaces " + strings.Join(m.Replaces, ",")
	}
	return s
}
