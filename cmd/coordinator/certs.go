package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/devca"
)

// caName is the development CA's name: its files are <dir>/quota-lease-ca.pem
// and quota-lease-ca-key.pem.
const caName = "quota-lease"

func certsCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("certs", "--regions R1,R2,... [--dir DIR] [--hosts H,...] [--agent-hosts H,...]",
		`Makes a development CA and the certificates of a deployment, each carrying
its SPIFFE identity (docs/security.md):
  coordinator.pem   spiffe://<domain>/role/coordinator: the coordinators' server
                    certificate; agents and the CLI accept no other server
  agent-<r>.pem     spiffe://<domain>/region/<r>: region r's agents (server and client)
  admin.pem, viewer.pem   the CLI's roles
  service.pem       no identity: services calling the agents' check APIs
Every certificate serves localhost and the loopback addresses; --hosts adds
names to the coordinator's only, --agent-hosts to the agents'. Per-instance
agent certificates, and any certificate again later (to rotate, or with
--valid-for), come from 'coordinator certs issue', which signs with the CA
key kept in DIR. For a laptop, a demo or a test bed; production issues from
its own CA. Refuses to overwrite an existing CA.`, stderr)
	dir := fs.String("dir", "certs", "directory to write the PEM files to")
	regions := fs.String("regions", "", "regions to issue agent certificates for, comma-separated (required)")
	domain := fs.String("trust-domain", "quota-lease",
		"SPIFFE trust domain (match serve --trust-domain and the agents' and CLI's --trust-domain)")
	hosts := fs.String("hosts", "",
		"extra DNS names (a leading *. for a wildcard) or IPs of the coordinators, comma-separated: only the "+
			"coordinator certificate gets them")
	agentHosts := fs.String("agent-hosts", "",
		"extra DNS names or IPs of the agents, comma-separated: every agent certificate gets them")
	validFor := fs.Duration("valid-for", 365*24*time.Hour, "how long the certificates are valid")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *regions == "" {
		return fmt.Errorf("--regions is required, e.g. --regions us,eu,ap")
	}
	if _, err := os.Stat(filepath.Join(*dir, caName+"-ca.pem")); err == nil {
		return fmt.Errorf("%s already holds a CA; remove it, choose another --dir, or issue more certificates "+
			"from it with 'coordinator certs issue --dir %s'", *dir, *dir)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	ca, err := devca.New(*dir, caName)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%-32s CA: give it to --tls-client-ca, --tls-ca, --coordinator-tls-ca\n", ca.CertFile)
	fmt.Fprintf(stdout, "%-32s CA key: signs 'certs issue'; keep it off the servers\n", ca.KeyFile)
	is := issuer{ca: ca, domain: *domain, validFor: *validFor, out: stdout}
	if err := is.issue("coordinator", &caller.CoordinatorID, list(*hosts)); err != nil {
		return err
	}
	for _, r := range list(*regions) {
		if err := is.issue("agent-"+r, &caller.ID{Kind: caller.Region, Name: r}, list(*agentHosts)); err != nil {
			return err
		}
	}
	for _, role := range []string{caller.Admin, caller.Viewer} {
		if err := is.issue(role, &caller.ID{Kind: caller.Role, Name: role}, nil); err != nil {
			return err
		}
	}
	return is.issue("service", nil, nil)
}

// issuer signs certificates from a development CA and says what it wrote.
type issuer struct {
	ca       *devca.CA
	domain   string
	validFor time.Duration
	out      io.Writer
}

// issue writes <name>.pem and <name>-key.pem: a certificate of id (nil:
// none, TLS only) serving loopback and hosts.
func (is issuer) issue(name string, id *caller.ID, hosts []string) error {
	if is.validFor <= 0 {
		return fmt.Errorf("--valid-for must be positive, got %v", is.validFor)
	}
	l := devca.Leaf{Name: name, Hosts: hosts, NotAfter: time.Now().Add(is.validFor)}
	who := "no identity: TLS only"
	if id != nil {
		u := caller.URI(is.domain, *id)
		l.URIs, who = append(l.URIs, u), u.String()
	}
	cert, _, err := is.ca.Issue(l)
	if err != nil {
		return fmt.Errorf("issue %s: %w", name, err)
	}
	if len(hosts) > 0 {
		who += " + " + strings.Join(hosts, ",")
	}
	fmt.Fprintf(is.out, "%-32s %s, until %s\n", cert, who, l.NotAfter.UTC().Format(time.DateOnly))
	return nil
}

// list splits a comma-separated flag value, dropping empty items.
func list(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// certsIssue issues one more certificate from the CA of certs.
func certsIssue(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("certs issue",
		"--dir DIR\n"+
			"    (--region R [--instance I] | --role admin|viewer|coordinator | --service NAME)\n"+
			"    [--valid-for D] [--hosts H,...]",
		`Issues one certificate from the development CA that 'coordinator certs' made
in DIR, over the files of the same name (that is how to rotate one:
processes pick the new files up within a second):
  --region R               agent-R.pem: spiffe://<domain>/region/R, any of R's agents
  --region R --instance I  agent-R.I.pem: spiffe://<domain>/region/R/instance/I,
                           which may lease only as --instance I (docs/security.md)
  --role ROLE              ROLE.pem: admin, viewer or coordinator
  --service NAME           NAME.pem: no identity, for a service calling the agents
--hosts adds DNS names or IPs the certificate serves (a coordinator's or an
agent's only), besides localhost and the loopback addresses.`, stderr)
	dir := fs.String("dir", "certs", "directory of the CA (quota-lease-ca.pem and its key) and the certificates")
	region := fs.String("region", "", "a region's agent certificate")
	instance := fs.String("instance", "", "with --region: one agent instance's certificate (its --instance)")
	role := fs.String("role", "", "an operator's or the coordinators' certificate: admin, viewer or coordinator")
	service := fs.String("service", "", "a service's client certificate without identity, named NAME")
	domain := fs.String("trust-domain", "quota-lease", "SPIFFE trust domain (match serve --trust-domain)")
	hosts := fs.String("hosts", "",
		"extra DNS names (a leading *. for a wildcard) or IPs it serves, comma-separated: coordinators and "+
			"agents only")
	validFor := fs.Duration("valid-for", 365*24*time.Hour, "how long the certificate is valid")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	name, id, err := issueTarget(*region, *instance, *role, *service)
	if err != nil {
		fs.Usage()
		return err
	}
	server := id != nil && (id.Kind == caller.Region || *id == caller.CoordinatorID)
	if *hosts != "" && !server {
		return fmt.Errorf("--hosts goes only into a server's certificate (--role coordinator or --region): %s "+
			"is a client", name)
	}
	ca, err := devca.Load(*dir, caName)
	if err != nil {
		return fmt.Errorf("load the CA of %s (made by 'coordinator certs'): %w", *dir, err)
	}
	return issuer{ca: ca, domain: *domain, validFor: *validFor, out: stdout}.issue(name, id, list(*hosts))
}

// issueTarget is the file name and identity certs issue's flags ask for:
// exactly one of region, role and service.
func issueTarget(region, instance, role, service string) (string, *caller.ID, error) {
	given := 0
	for _, v := range []string{region, role, service} {
		if v != "" {
			given++
		}
	}
	if given != 1 {
		return "", nil, fmt.Errorf("give exactly one of --region, --role and --service")
	}
	if instance != "" && region == "" {
		return "", nil, fmt.Errorf("--instance needs --region")
	}
	for _, v := range []string{region, instance, role, service} {
		if strings.ContainsAny(v, "/\\ ") || v == "." || v == ".." {
			return "", nil, fmt.Errorf("%q is not a usable name (no slashes or spaces)", v)
		}
	}
	switch {
	case region != "" && instance != "":
		return "agent-" + region + "." + instance, &caller.ID{Kind: caller.Region, Name: region, Instance: instance}, nil
	case region != "":
		return "agent-" + region, &caller.ID{Kind: caller.Region, Name: region}, nil
	case role != "":
		if role != caller.Admin && role != caller.Viewer && role != caller.Coordinator {
			return "", nil, fmt.Errorf("--role must be admin, viewer or coordinator, got %q", role)
		}
		return role, &caller.ID{Kind: caller.Role, Name: role}, nil
	default:
		return service, nil, nil
	}
}
