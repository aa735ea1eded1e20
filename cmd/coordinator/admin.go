package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/internal/mtls"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// DefaultCoordinator is the admin address when neither --coordinator nor
// $QUOTALEASE_COORDINATOR names one.
const DefaultCoordinator = "127.0.0.1:7400"

// adminFlags are the flags every admin command has.
type adminFlags struct {
	addrs   *string
	output  *string
	timeout *time.Duration
	tls     *mtls.Files
	domain  *string
	cluster *string
}

func addAdminFlags(fs *flag.FlagSet) adminFlags {
	return adminFlags{
		addrs: fs.String("coordinator", envOr("QUOTALEASE_COORDINATOR", DefaultCoordinator),
			"coordinator replicas, host:port[,host:port...]; the leader is found automatically"),
		output: fs.String("o", "table",
			"output format: table (YAML for quota get) or json (one style for every command: docs/cli.md)"),
		timeout: fs.Duration("timeout", 5*time.Second, "how long to wait for an answer"),
		tls:     mtls.ClientFlags(fs, ""),
		domain: fs.String("trust-domain", envOr("QUOTALEASE_TRUST_DOMAIN", "quota-lease"),
			"SPIFFE trust domain of the coordinators (their serve --trust-domain): with TLS, a server is accepted "+
				"only if its certificate names spiffe://<domain>/role/coordinator (env QUOTALEASE_TRUST_DOMAIN)"),
		cluster: fs.String("cluster-id", os.Getenv("QUOTALEASE_CLUSTER_ID"),
			"the cluster ID the coordinators must have (logged at their start); a coordinator of another "+
				"deployment then refuses the call (env QUOTALEASE_CLUSTER_ID)"),
	}
}

// call runs fn on the leader's admin service.
func (a adminFlags) call(
	ctx context.Context,
	fn func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) error,
) error {
	if *a.output != "table" && *a.output != "json" {
		return fmt.Errorf("-o must be table or json, got %q", *a.output)
	}
	cl, err := leaseapi.NewClient(strings.Split(*a.addrs, ","))
	if err != nil {
		return err
	}
	defer cl.Close()
	cl.SetClusterID(*a.cluster)
	if a.tls.Enabled() {
		cfg, err := leaseapi.CoordinatorTLS(*a.tls, *a.domain)
		if err != nil {
			return err
		}
		cl.UseTLS(cfg)
	}
	ctx, cancel := context.WithTimeout(ctx, *a.timeout)
	defer cancel()
	err = cl.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return fn(ctx, pb.NewAdminServiceClient(cc), opts...)
	})
	if err != nil && !a.tls.Enabled() && strings.Contains(err.Error(), "server preface") {
		return fmt.Errorf("%w\n(the coordinator seems to serve TLS: give --tls-ca, --tls-cert and --tls-key, or "+
			"QUOTALEASE_TLS_CA, _CERT and _KEY)", err)
	}
	return plainRPCError(err, *a.timeout)
}

// envOr is the environment variable name's value, or def when it is
// unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (a adminFlags) json() bool { return *a.output == "json" }

// adminCall runs one admin RPC on the leader and, with -o json, prints the
// answer; printed tells the caller that nothing is left to print.
func adminCall[R proto.Message](
	ctx context.Context,
	af adminFlags,
	stdout io.Writer,
	rpc func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (R, error),
) (resp R, printed bool, err error) {
	err = af.call(ctx, func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (err error) {
		resp, err = rpc(ctx, c, opts...)
		return err
	})
	if err != nil || !af.json() {
		return resp, false, err
	}
	return resp, true, printJSON(stdout, resp)
}

func quotaSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("quota set", "-f FILE",
		"Stores every policy in FILE (YAML, one per document): all of them or none.\nA policy with the name of "+
			"a stored one replaces it; grants already out keep\ncounting until they end, so a lowered limit takes "+
			"effect within one lease.", stderr)
	af := addAdminFlags(fs)
	file := fs.String("f", "", "policy file; - reads standard input")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *file == "" {
		fs.Usage()
		return cli.ErrUsage
	}
	data, err := readPolicyFile(*file)
	if err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.SetPolicyResponse, error) {
			return c.SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: string(data)}, opts...)
		})
	if err != nil || printed {
		return err
	}
	for _, p := range resp.Policies {
		fmt.Fprintf(stdout, "stored policy %s (version %d)\n", p.Name, p.Version)
	}
	return nil
}

func quotaGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("quota get", "NAME",
		"Prints a stored policy as YAML (or JSON with -o json), defaults filled in.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 1, 1); err != nil {
		return err
	}
	var rec *pb.PolicyRecord
	if err := af.call(ctx, func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (err error) {
		rec, err = c.GetPolicy(ctx, &pb.GetPolicyRequest{Name: fs.Arg(0)}, opts...)
		return err
	}); err != nil {
		return err
	}
	ps, err := leaseapi.DecodePolicies([]*pb.PolicyRecord{rec})
	if err != nil {
		return err
	}
	if af.json() {
		return writeJSON(stdout, ps[0])
	}
	if rec.Source != "" {
		fmt.Fprintf(stdout, "# managed by %s\n", rec.Source)
	}
	return yaml.NewEncoder(stdout).Encode(ps[0])
}

func quotaList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("quota list", "", "Lists the stored policies.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.ListPoliciesResponse, error) {
			return c.ListPolicies(ctx, &pb.ListPoliciesRequest{}, opts...)
		})
	if err != nil || printed {
		return err
	}
	ps, err := leaseapi.DecodePolicies(resp.Policies)
	if err != nil {
		return err
	}
	sources := map[string]string{}
	for _, r := range resp.Policies {
		if r.Source != "" {
			sources[r.Name] = r.Source
		}
	}
	return printPolicies(stdout, ps, sources)
}

func quotaDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("quota delete", "NAME",
		"Deletes a policy and its leases. Agents enforcing it fall back to their\ndegraded budget, then admit "+
			"nothing for it.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 1, 1); err != nil {
		return err
	}
	if err := af.call(ctx, func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) error {
		_, err := c.DeletePolicy(ctx, &pb.DeletePolicyRequest{Name: fs.Arg(0)}, opts...)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "deleted policy %s\n", fs.Arg(0))
	return nil
}

// units formats micro-units as units with up to three decimals.
func units(micro int64) string {
	return strconv.FormatFloat(policy.Units(micro), 'f', -1, 64)
}

func percent(part, whole int64) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(part)/float64(whole))
}

func leasesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("leases", "[--region R] [--identities]",
		"Lists every region's lease on every quota. SHARE is the granted share,\nENFORCING what the region may "+
			"be enforcing now (an unacknowledged larger\nold grant, or a lapsed region's degraded budget), "+
			"RESERVED the degraded\nbudget kept for a lapsed region. Shares are in units per period "+
			"(token\nbucket: per second; windows: per window) and as a part of the limit.\nENVOYS, BUCKETS, "+
			"ASSIGNED and USAGE are the edge: the Envoy instances\nstreaming to the region's agents (Rate Limit "+
			"Quota Service; Go services\nusing the client library counted with them and named apart, \"6 "+
			"(3\nlibrary)\"), their buckets, the refill assigned to them and the rate they\nreport, in the same "+
			"units, as of each agent's last renewal\n(docs/rlqs-server.md); - for none.\nWith --identities, the "+
			"identities with shares of their own instead: each\nregion's share of the identity's limit "+
			"(docs/identity-shares.md).", stderr)
	af := addAdminFlags(fs)
	region := fs.String("region", "", "show only this region")
	identities := fs.Bool("identities", false, "list the identities with shares of their own, and where")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.ListLeasesResponse, error) {
			return c.ListLeases(ctx, &pb.ListLeasesRequest{Region: *region}, opts...)
		})
	if err != nil || printed {
		return err
	}
	if *identities {
		return printIdentityShares(stdout, resp.Leases)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA\tREGION\tINSTANCE\tSTATE\tSHARE\tENFORCING\tRESERVED\tEXPIRES "+
		"IN\tDEMAND\tENVOYS\tBUCKETS\tASSIGNED\tUSAGE")
	for _, l := range resp.Leases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s (%s)\t%s\t%s\t%s\t%s\t%s\n", l.Quota, l.Region, l.Instance, l.State,
			units(l.Rate), percent(l.Rate, l.Limit), units(l.Enforcing), units(l.Reserved),
			(time.Duration(l.ExpiresInMs) * time.Millisecond).String(), units(l.Demand), edgeColumns(l))
	}
	return tw.Flush()
}

// edgeColumns are a lease's edge columns: instances (Envoys and, named
// apart, Go services using the client library), buckets, the assigned
// refill (and its part of the limit) and the reported usage.
func edgeColumns(l *pb.LeaseRecord) string {
	e := l.Edge
	if e == nil {
		return "-\t-\t-\t-"
	}
	instances := strconv.Itoa(int(e.Instances))
	if e.LibraryInstances > 0 {
		instances += fmt.Sprintf(" (%d library)", e.LibraryInstances)
	}
	return fmt.Sprintf("%s\t%d\t%s (%s)\t%s", instances, e.Buckets, units(e.Assigned), percent(e.Assigned, l.Limit),
		units(e.Usage))
}

// printIdentityShares lists, per quota and identity with shares of its
// own, each region's share of the identity's limit.
func printIdentityShares(stdout io.Writer, leases []*pb.LeaseRecord) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA\tIDENTITY\tREGION\tSHARE")
	n := 0
	for _, l := range leases {
		for _, id := range slices.Sorted(maps.Keys(l.Identities)) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%s)\n", l.Quota, id, l.Region, units(l.Identities[id]),
				percent(l.Identities[id], l.Limit))
			n++
		}
	}
	if n == 0 {
		fmt.Fprintln(tw, "(no identity holds shares of its own: every identity gets its region's share)")
	}
	return tw.Flush()
}

func release(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("release", "REGION [--quota Q]",
		"Drops the reserved degraded budget of a region whose lease lapsed, so other\nregions may use its "+
			"share. Do this only when the region is known to be down:\nif it is merely partitioned it may still be "+
			"admitting on that budget.", stderr)
	af := addAdminFlags(fs)
	quota := fs.String("quota", "", "release only this quota")
	if err := parse(fs, args, 1, 1); err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.ReleaseRegionResponse, error) {
			return c.ReleaseRegion(ctx, &pb.ReleaseRegionRequest{Region: fs.Arg(0), Quota: *quota}, opts...)
		})
	if err != nil || printed {
		return err
	}
	fmt.Fprintf(stdout, "released %d lease(s) of region %s\n", resp.Released, fs.Arg(0))
	return nil
}

func rebalance(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("rebalance", "--now | --pause | --resume",
		"Triggers a rebalancing round now, or pauses or resumes rebalancing (shares\nstay where they are while "+
			"paused). The pause survives leader changes.", stderr)
	af := addAdminFlags(fs)
	now := fs.Bool("now", false, "run a rebalancing round now (still damped)")
	pause := fs.Bool("pause", false, "pause rebalancing")
	resume := fs.Bool("resume", false, "resume rebalancing")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	var action pb.RebalanceRequest_Action
	n := 0
	for _, c := range []struct {
		set bool
		a   pb.RebalanceRequest_Action
	}{
		{*now, pb.RebalanceRequest_ACTION_NOW},
		{*pause, pb.RebalanceRequest_ACTION_PAUSE},
		{*resume, pb.RebalanceRequest_ACTION_RESUME},
	} {
		if c.set {
			action, n = c.a, n+1
		}
	}
	if n != 1 {
		fs.Usage()
		return cli.ErrUsage
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.RebalanceResponse, error) {
			return c.Rebalance(ctx, &pb.RebalanceRequest{Action: action}, opts...)
		})
	if err != nil || printed {
		return err
	}
	state := "running"
	if resp.Paused {
		state = "paused"
	}
	fmt.Fprintf(stdout, "rebalancing is %s\n", state)
	return nil
}

func regionsSetWeight(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("regions set-weight", "NAME WEIGHT",
		"Declares region NAME, or changes its weight. Weights split quotas under the\nstatic strategy and "+
			"spread surplus under the others.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 2, 2); err != nil {
		return err
	}
	w, err := strconv.ParseFloat(fs.Arg(1), 64)
	if err != nil {
		return fmt.Errorf("weight %q is not a number", fs.Arg(1))
	}
	rec, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.RegionRecord, error) {
			return c.SetRegion(ctx, &pb.SetRegionRequest{Name: fs.Arg(0), Weight: w}, opts...)
		})
	if err != nil || printed {
		return err
	}
	fmt.Fprintf(stdout, "region %s has weight %v\n", rec.Name, rec.Weight)
	return nil
}

func regionsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("regions list", "", "Lists the declared regions and their weights.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.ListRegionsResponse, error) {
			return c.ListRegions(ctx, &pb.ListRegionsRequest{}, opts...)
		})
	if err != nil || printed {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tWEIGHT")
	for _, r := range resp.Regions {
		fmt.Fprintf(tw, "%s\t%v\n", r.Name, r.Weight)
	}
	return tw.Flush()
}

func boundCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bound", "[QUOTA]",
		"Prints, per quota, the most all regions together can admit in one window\n(the policy's period) in the "+
			"worst case, the overshoot over the limit, and\nthe terms it is made of. docs/bound.md derives it.", stderr)
	af := addAdminFlags(fs)
	if err := parse(fs, args, 0, 1); err != nil {
		return err
	}
	resp, printed, err := adminCall(ctx, af, stdout,
		func(ctx context.Context, c pb.AdminServiceClient, opts ...grpc.CallOption) (*pb.GetBoundResponse, error) {
			return c.GetBound(ctx, &pb.GetBoundRequest{Quota: fs.Arg(0)}, opts...)
		})
	if err != nil || printed {
		return err
	}
	fmt.Fprintln(stdout, "REFERENCE: the most one ideal global limiter admits in one window (burst + rate x "+
		"window); WORST CASE: the most all regions together can; TERMS: what makes it up (docs/bound.md)")
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QUOTA\tWINDOW\tREFERENCE\tWORST CASE\tOVERSHOOT\tTERMS")
	for _, b := range resp.Bounds {
		names := make([]string, 0, len(b.Terms))
		for n := range b.Terms {
			names = append(names, n)
		}
		sort.Strings(names)
		var terms []string
		for _, n := range names {
			terms = append(terms, fmt.Sprintf("%s=%.4g", n, b.Terms[n]))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4g\t%.4g\t%.4g (%.1f%%)\t%s\n",
			b.Quota, time.Duration(b.WindowSeconds*float64(time.Second)),
			b.Limit, b.WorstCase, b.Overshoot, 100*b.OvershootRatio, strings.Join(terms, " "))
	}
	return tw.Flush()
}
