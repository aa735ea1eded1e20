package caller

import (
	"crypto/x509"
	"errors"
	"net/url"
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
