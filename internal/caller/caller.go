// Package caller names who is at the other end of a mutual TLS
// connection: the SPIFFE-style identity in a certificate's URI SAN,
// spiffe://<trust-domain>/region/<name>[/instance/<i>] for a region's
// agents, spiffe://<trust-domain>/role/<admin|viewer> for operators and
// their tools, and spiffe://<trust-domain>/role/coordinator for the
// coordinators. The coordinator authorizes calls by the caller's identity;
// agents and the CLI accept a server as a coordinator only by its identity
// (Expect), since any leaf of the deployment's CA passes the chain and
// host name checks. (Whom a request counts against, the rate-limit
// identity, is policy.Policy.IdentityOf's.)
package caller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Kind is what an identity is.
type Kind string

// The kinds of identity.
const (
	Region Kind = "region"
	Role   Kind = "role"
)

// The roles.
const (
	Admin  = "admin"
	Viewer = "viewer"
	// Coordinator is the coordinators' server identity: it calls nothing,
	// and clients accept only a server that has it (Expect).
	Coordinator = "coordinator"
)

// CoordinatorID is the coordinators' identity.
var CoordinatorID = ID{Kind: Role, Name: Coordinator}

// ID is one caller's identity.
type ID struct {
	Kind Kind
	Name string // the region, or the role
	// Instance, for a region, names the one agent instance a certificate
	// of spiffe://<domain>/region/<r>/instance/<i> belongs to; empty for a
	// certificate shared by the region's instances.
	Instance string
}

func (id ID) String() string {
	s := string(id.Kind) + "/" + id.Name
	if id.Instance != "" {
		s += "/instance/" + id.Instance
	}
	return s
}

// URI is the SAN of id in trustDomain, as certificates carry it.
func URI(trustDomain string, id ID) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/" + id.String()}
}

// ErrNoIdentity reports a caller without a usable identity: no client
// certificate, or none naming a region or role of the trust domain.
var ErrNoIdentity = errors.New("no identity")

// FromCert returns the identity cert's URI SANs name in trustDomain:
// /region/<r>, /region/<r>/instance/<i>, /role/admin, /role/viewer or
// /role/coordinator. A
// certificate naming more than one is refused: an identity must be one
// thing.
func FromCert(cert *x509.Certificate, trustDomain string) (ID, error) {
	var found []ID
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != trustDomain {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
		if len(parts) < 2 || parts[1] == "" {
			continue
		}
		switch k := Kind(parts[0]); {
		case k == Region && len(parts) == 2:
			found = append(found, ID{Kind: k, Name: parts[1]})
		case k == Region && len(parts) == 4 && parts[2] == "instance" && parts[3] != "":
			found = append(found, ID{Kind: k, Name: parts[1], Instance: parts[3]})
		case len(parts) != 2:
			continue
		case k == Role:
			if parts[1] == Admin || parts[1] == Viewer || parts[1] == Coordinator {
				found = append(found, ID{Kind: k, Name: parts[1]})
			}
		}
	}
	switch len(found) {
	case 0:
		return ID{}, fmt.Errorf("%w: the certificate names no spiffe://%s/region/... or "+
			"/role/admin|viewer|coordinator", ErrNoIdentity, trustDomain)
	case 1:
		return found[0], nil
	default:
		return ID{}, fmt.Errorf("%w: the certificate names %d identities; issue one per certificate",
			ErrNoIdentity, len(found))
	}
}

// FromContext returns the identity of a gRPC call's verified client
// certificate.
func FromContext(ctx context.Context, trustDomain string) (ID, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ID{}, fmt.Errorf("%w: no peer", ErrNoIdentity)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return ID{}, fmt.Errorf("%w: the connection is not TLS", ErrNoIdentity)
	}
	return FromTLS(&ti.State, trustDomain)
}

// FromTLS returns the identity of a TLS connection's verified client
// certificate (an HTTP request's r.TLS; nil for plaintext).
func FromTLS(cs *tls.ConnectionState, trustDomain string) (ID, error) {
	if cs == nil {
		return ID{}, fmt.Errorf("%w: the connection is not TLS", ErrNoIdentity)
	}
	chains := cs.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return ID{}, fmt.Errorf("%w: no verified client certificate", ErrNoIdentity)
	}
	return FromCert(chains[0][0], trustDomain)
}
