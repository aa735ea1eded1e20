package cluster

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"

	"google.golang.org/grpc/credentials"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/devca"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// TrustDomain is the SPIFFE trust domain of a cluster's certificates (the
// binaries' default).
const TrustDomain = "quota-lease"

// pki is a cluster's throwaway CA and the certificates of its parts: every
// listener serves mutual TLS, so the secure path is the one tested.
type pki struct {
	ca          *devca.CA
	leaves      map[string]*caller.ID // every certificate issued, by name
	files       map[string]mtls.Files // and its files
	coordinator mtls.Files            // the coordinators' server certificate
	regions     map[string]mtls.Files // each region's agent: server and client
	admin       mtls.Files            // the harness's admin client
	viewer      mtls.Files            // an SRE's read-only client (role viewer)
	service     mtls.Files            // the traffic driver, as a service calling agents
}

func newPKI(dir string, regions []string) (*pki, error) {
	dir = filepath.Join(dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := devca.New(dir, "cluster")
	if err != nil {
		return nil, err
	}
	p := &pki{ca: ca, regions: map[string]mtls.Files{}, leaves: map[string]*caller.ID{}, files: map[string]mtls.Files{}}
	issue := p.issue
	if p.coordinator, err = issue("coordinator", &caller.CoordinatorID); err != nil {
		return nil, err
	}
	if p.admin, err = issue("admin", &caller.ID{Kind: caller.Role, Name: caller.Admin}); err != nil {
		return nil, err
	}
	if p.viewer, err = issue("viewer", &caller.ID{Kind: caller.Role, Name: caller.Viewer}); err != nil {
		return nil, err
	}
	if p.service, err = issue("service", nil); err != nil {
		return nil, err
	}
	for _, r := range regions {
		if p.regions[r], err = issue("agent-"+r, &caller.ID{Kind: caller.Region, Name: r}); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// issue signs a certificate for name (with id's URI SAN, if any) and
// writes it over the files of that name.
func (p *pki) issue(name string, id *caller.ID) (mtls.Files, error) {
	l := devca.Leaf{Name: name}
	if id != nil {
		l.URIs = append(l.URIs, caller.URI(TrustDomain, *id))
	}
	p.leaves[name] = id
	cert, key, err := p.ca.Issue(l)
	f := mtls.Files{Cert: cert, Key: key, CA: p.ca.CertFile}
	p.files[name] = f
	return f, err
}

// serverArgs are a listener's TLS flags for f.
func serverArgs(f mtls.Files) []string {
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-client-ca", f.CA}
}

// clientTLS is the client configuration of f.
func clientTLS(f mtls.Files) (*tls.Config, error) { return mtls.Client(f, "") }

// grpcCreds are f's gRPC client credentials.
func grpcCreds(f mtls.Files) (credentials.TransportCredentials, error) {
	cfg, err := clientTLS(f)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// httpClient is an HTTPS client presenting f.
func httpClient(f mtls.Files) (*http.Client, error) {
	cfg, err := clientTLS(f)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}, nil
}
