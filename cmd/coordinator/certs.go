package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/devca"
)

func certsCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("certs", "--regions R1,R2,... [--dir DIR]", `Makes a development CA and the certificates of a deployment: the
coordinators' server certificate, one per region for its agents, an admin
and a viewer for the CLI, and a service certificate for callers of the
agents. Each carries its SPIFFE identity (docs/security.md). For a laptop,
a demo or a test bed; production issues from its own CA. Refuses to
overwrite an existing CA.`, stderr)
	dir := fs.String("dir", "certs", "directory to write the PEM files to")
	regions := fs.String("regions", "", "regions to issue agent certificates for, comma-separated (required)")
	domain := fs.String("trust-domain", "quota-lease", "SPIFFE trust domain (match coordinator serve --trust-domain)")
	hosts := fs.String("hosts", "", "extra DNS names or IPs the coordinator and agent certificates serve, comma-separated (localhost and loopback are always in)")
	if err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	if *regions == "" {
		return fmt.Errorf("--regions is required, e.g. --regions us,eu,ap")
	}
	if _, err := os.Stat(*dir + "/quota-lease-ca.pem"); err == nil {
		return fmt.Errorf("%s already holds a CA; remove it or choose another --dir", *dir)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	ca, err := devca.New(*dir, "quota-lease")
	if err != nil {
		return err
	}
	var extra []string
	if *hosts != "" {
		extra = strings.Split(*hosts, ",")
	}
	issue := func(name string, id *caller.ID) error {
		l := devca.Leaf{Name: name, Hosts: extra}
		if id != nil {
			l.URIs = append(l.URIs, caller.URI(*domain, *id))
		}
		cert, _, err := ca.Issue(l)
		if err == nil {
			who := "no identity: TLS only"
			if id != nil {
				who = id.String()
			}
			fmt.Fprintf(stdout, "%-28s %s\n", cert, who)
		}
		return err
	}
	fmt.Fprintf(stdout, "%-28s CA: give it to --tls-client-ca, --tls-ca, --coordinator-tls-ca\n", ca.CertFile)
	if err := issue("coordinator", nil); err != nil {
		return err
	}
	for _, r := range strings.Split(*regions, ",") {
		if err := issue("agent-"+r, &caller.ID{Kind: caller.Region, Name: r}); err != nil {
			return err
		}
	}
	for _, role := range []string{caller.Admin, caller.Viewer} {
		if err := issue(role, &caller.ID{Kind: caller.Role, Name: role}); err != nil {
			return err
		}
	}
	return issue("service", nil)
}
