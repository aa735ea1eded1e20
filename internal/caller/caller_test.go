package caller

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestFromCert(t *testing.T) {
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	for _, c := range []struct {
		uris []*url.URL
		want ID
		err  bool
	}{
		{[]*url.URL{u("spiffe://qd/region/us")}, ID{Region, "us", ""}, false},
		{[]*url.URL{u("spiffe://qd/role/admin")}, ID{Role, Admin, ""}, false},
		{[]*url.URL{u("spiffe://qd/role/coordinator")}, CoordinatorID, false},
		{[]*url.URL{u("spiffe://qd/region/us/instance/us-a")}, ID{Region, "us", "us-a"}, false},
		{[]*url.URL{u("spiffe://qd/role/viewer"), u("https://example.com/x")}, ID{Role, Viewer, ""}, false},
		{[]*url.URL{u("spiffe://other/role/admin")}, ID{}, true},                          // another trust domain
		{[]*url.URL{u("spiffe://qd/role/root")}, ID{}, true},                              // no such role
		{[]*url.URL{u("spiffe://qd/region/us/extra")}, ID{}, true},                        // malformed
		{[]*url.URL{u("spiffe://qd/region/us"), u("spiffe://qd/role/admin")}, ID{}, true}, // two identities
		{nil, ID{}, true},
	} {
		got, err := FromCert(&x509.Certificate{URIs: c.uris}, "qd")
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%v: %v, %v; want %v (error %v)", c.uris, got, err, c.want, c.err)
		}
		if err != nil && !errors.Is(err, ErrNoIdentity) {
			t.Errorf("%v: error %v does not wrap ErrNoIdentity", c.uris, err)
		}
	}
	if got := URI("qd", ID{Kind: Region, Name: "eu"}).String(); got != "spiffe://qd/region/eu" {
		t.Errorf("URI = %s", got)
	}
}

// Expect admits a server whose certificate names the identity wanted, and
// refuses one naming another or none, saying which.
func TestExpect(t *testing.T) {
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	check := Expect("qd", CoordinatorID)
	state := func(uris ...*url.URL) tls.ConnectionState {
		return tls.ConnectionState{PeerCertificates: []*x509.Certificate{{URIs: uris}}}
	}
	if err := check(state(u("spiffe://qd/role/coordinator"))); err != nil {
		t.Fatalf("the coordinator refused: %v", err)
	}
	for _, c := range []struct {
		uris []*url.URL
		says string
	}{
		{nil, "no identity"},
		{[]*url.URL{u("spiffe://qd/region/us")}, "spiffe://qd/region/us"},
		{[]*url.URL{u("spiffe://other/role/coordinator")}, "no identity"},
		{[]*url.URL{u("spiffe://qd/role/admin")}, "spiffe://qd/role/admin"},
	} {
		err := check(state(c.uris...))
		if !errors.Is(err, ErrWrongPeer) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "not spiffe://qd/role/coordinator") {
			t.Errorf("%v: %v", c.uris, err)
		}
	}
	if err := check(tls.ConnectionState{}); !errors.Is(err, ErrWrongPeer) {
		t.Errorf("no certificate: %v", err)
	}
}
