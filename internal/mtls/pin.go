package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// PinPeer makes client configuration c accept only a server whose
// certificate carries id, as a URI SAN (a SPIFFE ID, spiffe://...) or a
// DNS name, besides a chain to c's CAs and the name c dials: where one CA
// signs more than the servers c should trust (a deployment's CA signs
// every agent and service), the chain and a host name say little.
func PinPeer(c *tls.Config, id string) {
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the server presented no certificate")
		}
		if leaf := cs.PeerCertificates[0]; !names(leaf, id) {
			return fmt.Errorf("the server's certificate does not name %s (it names %s)", id, strings.Join(namesOf(leaf), ", "))
		}
		return nil
	}
}

func names(cert *x509.Certificate, id string) bool {
	for _, n := range namesOf(cert) {
		if n == id {
			return true
		}
	}
	return false
}

// namesOf lists a certificate's URI and DNS names.
func namesOf(cert *x509.Certificate) []string {
	var out []string
	for _, u := range cert.URIs {
		out = append(out, u.String())
	}
	return append(out, cert.DNSNames...)
}
