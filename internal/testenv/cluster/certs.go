package cluster

import (
	"crypto/tls"
	"fmt"
)

// Rotate issues every certificate again, replacing its files in place, as
// an operator rotating certificates does; the processes pick them up.
func (c *Cluster) Rotate() error {
	for name, id := range c.pki.leaves {
		if _, err := c.pki.issue(name, id); err != nil {
			return err
		}
	}
	return nil
}

// ClientTLS is the client TLS configuration of one of the cluster's
// certificates, by name: "admin", "viewer" (role viewer), "service" (no
// identity) or "agent-<region>".
func (c *Cluster) ClientTLS(name string) (*tls.Config, error) {
	f, ok := c.pki.files[name]
	if !ok {
		return nil, fmt.Errorf("no certificate %q in this cluster", name)
	}
	return clientTLS(f)
}
