package leaseapi

import (
	"crypto/tls"
	"fmt"

	"github.com/quota-lease/quota-lease/internal/caller"
	"github.com/quota-lease/quota-lease/internal/mtls"
)

// CoordinatorTLS is the TLS configuration of a client of the coordinators
// (an agent, the CLI): f's CA verifies the chain and host name, f's
// certificate, if any, is presented, and the server must carry the
// coordinator identity of trustDomain (caller.CoordinatorID). Every leaf
// of the deployment's CA passes the first two checks, so without the
// third an agent's or a service's certificate could serve as a coordinator.
func CoordinatorTLS(f mtls.Files, trustDomain string) (*tls.Config, error) {
	if trustDomain == "" {
		return nil, fmt.Errorf("tls: the coordinators' trust domain is empty: give --trust-domain (the " +
			"coordinators' serve --trust-domain, default quota-lease)")
	}
	cfg, err := mtls.Client(f, "")
	if err != nil {
		return nil, err
	}
	cfg.VerifyConnection = caller.Expect(trustDomain, caller.CoordinatorID)
	return cfg, nil
}
