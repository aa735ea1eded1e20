package mtls

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/devca"
)

func TestCheckExposure(t *testing.T) {
	for _, c := range []struct {
		addr             string
		mutual, insecure bool
		ok, warn         bool
	}{
		{"127.0.0.1:7400", false, false, true, false},
		{"localhost:7400", false, false, true, false},
		{"[::1]:7400", false, false, true, false},
		{"", false, false, true, false},
		{"0.0.0.0:7400", false, false, false, false},
		{":7400", false, false, false, false},
		{"10.0.0.5:7400", true, false, true, false},
		{"10.0.0.5:7400", false, true, true, true},
	} {
		warn, err := CheckExposure("--listen", c.addr, c.mutual, c.insecure)
		if (err == nil) != c.ok || (warn != "") != c.warn {
			t.Errorf("%+v: warning %q, error %v", c, warn, err)
		}
		if err != nil && !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("%s: the error does not say what to do: %v", c.addr, err)
		}
	}
}

func TestFilesNeeded(t *testing.T) {
	if _, err := Server(Files{Cert: "c.pem"}); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("a certificate without a key: %v", err)
	}
	if _, err := Client(Files{Cert: "c.pem", Key: "k.pem"}, ""); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("a client without a CA: %v", err)
	}
	if _, err := Server(Files{Cert: "/nonexistent.pem", Key: "/nonexistent-key.pem"}); err == nil {
		t.Error("missing files accepted")
	}
}

// A rotated certificate is served once its files change; a file caught
// half-written keeps the previous certificate in service.
func TestReloadKeepsLastGoodFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := devca.New(dir, "t")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(devca.Leaf{Name: "srv"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := newReloader(Files{Cert: cert, Key: key, CA: ca.CertFile})
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := r.current()
	if err := os.WriteFile(cert, []byte("-----BEGIN CERT"), 0o600); err != nil { // half written
		t.Fatal(err)
	}
	r.checked = time.Time{}
	if c, _, _ := r.current(); c != first {
		t.Fatal("a half-written certificate replaced the good one")
	}
	if _, _, err := ca.Issue(devca.Leaf{Name: "srv"}); err != nil {
		t.Fatal(err)
	}
	r.checked = time.Time{}
	second, _, _ := r.current()
	if string(second.Certificate[0]) == string(first.Certificate[0]) {
		t.Fatal("the rotated certificate was not loaded")
	}
}

func TestRequireClientCert(t *testing.T) {
	h := RequireClientCert(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), "/metrics")
	for path, want := range map[string]int{"/metrics": 200, "/v1/check": 401} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", path, nil))
		if rec.Code != want {
			t.Errorf("%s without a client certificate: %d, want %d", path, rec.Code, want)
		}
	}
}
