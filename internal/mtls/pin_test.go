package mtls

import (
	"crypto/tls"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/internal/devca"
)

// A pinned client accepts a server of its CA only if the server's
// certificate names the pinned identity: the same CA's certificate for
// another role is refused, with both names in the error.
func TestPinPeer(t *testing.T) {
	ca, err := devca.New(t.TempDir(), "deployment")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name, uri string) Files {
		u, _ := url.Parse(uri)
		c, k, err := ca.Issue(devca.Leaf{Name: name, URIs: []*url.URL{u}})
		if err != nil {
			t.Fatal(err)
		}
		return Files{Cert: c, Key: k, CA: ca.CertFile}
	}
	xds, service := issue("xds", "spiffe://qd/role/xds"), issue("service", "spiffe://qd/role/service")
	serve := func(f Files) string {
		sc, err := Server(Files{Cert: f.Cert, Key: f.Key})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := tls.Listen("tcp", "127.0.0.1:0", sc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lis.Close() })
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		return lis.Addr().String()
	}
	dial := func(addr, pin string) error {
		cc, err := Client(Files{CA: ca.CertFile}, "")
		if err != nil {
			t.Fatal(err)
		}
		if pin != "" {
			PinPeer(cc, pin)
		}
		host, _, _ := net.SplitHostPort(addr)
		cc.ServerName = host
		c, err := tls.Dial("tcp", addr, cc)
		if err == nil {
			c.Close()
		}
		return err
	}
	good, bad := serve(xds), serve(service)
	if err := dial(good, "spiffe://qd/role/xds"); err != nil {
		t.Errorf("the pinned server: %v", err)
	}
	if err := dial(bad, ""); err != nil {
		t.Errorf("unpinned, any server of the CA passes: %v", err)
	}
	err = dial(bad, "spiffe://qd/role/xds")
	if err == nil || !strings.Contains(err.Error(), "does not name spiffe://qd/role/xds") || !strings.Contains(err.Error(), "spiffe://qd/role/service") {
		t.Errorf("a service certificate where the xDS server was pinned: %v, want refused naming both", err)
	}
}
