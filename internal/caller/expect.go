package caller

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// ErrWrongPeer reports a server whose certificate, though signed by the
// trusted CA, does not name the identity the client expects.
var ErrWrongPeer = errors.New("wrong server")

// Expect returns a tls.Config.VerifyConnection check for a client: the
// server's certificate must name want in trustDomain. The chain and host
// name are verified before it runs; a CA signs every part of a deployment,
// so only the identity tells a coordinator from an agent or a service
// holding a leaf of the same CA.
func Expect(trustDomain string, want ID) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: it presented no certificate", ErrWrongPeer)
		}
		got, err := FromCert(cs.PeerCertificates[0], trustDomain)
		if err == nil && got == want {
			return nil
		}
		named := "no identity"
		if err == nil {
			named = URI(trustDomain, got).String()
		}
		return fmt.Errorf("%w: its certificate names %s, not %s, so it is no %s of this deployment. "+
			"Check the address; a %s's certificate needs that URI SAN (coordinator certs issues it; --trust-domain must match)",
			ErrWrongPeer, named, URI(trustDomain, want), want.Name, want.Name)
	}
}
