// Package mtls builds the TLS 1.3 configurations of quota-lease's
// listeners and clients from certificate files, with mutual
// authentication, and re-reads the files when they change, so that a
// certificate is rotated by replacing its files: no restart, and no
// connection already open is touched.
package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Files names the PEM files of one side of a connection.
type Files struct {
	// Cert and Key are this side's certificate chain and private key.
	Cert, Key string
	// CA verifies the other side: a server's clients (the client CA), or
	// a client's servers.
	CA string
}

// Enabled reports whether any file is set.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// validate checks that the files a side needs are all given.
func (f Files) validate(server bool) error {
	switch {
	case (f.Cert == "") != (f.Key == ""):
		return errors.New("tls: give both a certificate and its key (--tls-cert, --tls-key)")
	case server && f.Cert == "":
		return errors.New("tls: a server needs a certificate and key (--tls-cert, --tls-key)")
	case !server && f.CA == "":
		return errors.New("tls: a client needs the CA that signed its servers (--tls-ca)")
	}
	return nil
}

// recheck is how often, at most, the files are looked at again.
const recheck = time.Second

// Server returns the configuration of a listener: TLS 1.3 only, serving
// f's certificate, and, when f.CA is set, requiring every client to present
// a certificate it signed. Both are re-read when their files change.
func Server(f Files) (*tls.Config, error) { return server(f, tls.RequireAndVerifyClientCert) }

// ServerOptionalClient is Server for listeners that must stay reachable
// without a client certificate (metrics, health): one presented is still
// verified against f.CA.
func ServerOptionalClient(f Files) (*tls.Config, error) {
	return server(f, tls.VerifyClientCertIfGiven)
}

func server(f Files, auth tls.ClientAuthType) (*tls.Config, error) {
	if err := f.validate(true); err != nil {
		return nil, err
	}
	kp, err := newReloader(f)
	if err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS13}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool, err := kp.current()
		if err != nil {
			return nil, err
		}
		c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
			NextProtos: []string{"h2", "http/1.1"}}
		if pool != nil {
			c.ClientCAs, c.ClientAuth = pool, auth
		}
		return c, nil
	}
	return base, nil
}

// Client returns the configuration of a client: TLS 1.3 only, verifying
// servers (name and chain) against f.CA, and presenting f's certificate
// when given, re-read when its files change. The CA bundle is read once:
// rotate a CA by adding the new one to the bundle before any server uses
// it. serverName, when set, overrides the name verified.
func Client(f Files, serverName string) (*tls.Config, error) {
	if err := f.validate(false); err != nil {
		return nil, err
	}
	kp, err := newReloader(f)
	if err != nil {
		return nil, err
	}
	_, pool, _ := kp.current()
	c := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: serverName, RootCAs: pool}
	if f.Cert != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _, err := kp.current()
			return cert, err
		}
	}
	return c, nil
}

// reloader holds the parsed files and reloads them when their size or
// modification time changes (looked at no more than once a second). A
// reload that fails keeps the previous contents, so a half-written file
// never breaks new connections.
type reloader struct {
	f Files

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cert    *tls.Certificate
	pool    *x509.CertPool
}

func newReloader(f Files) (*reloader, error) {
	r := &reloader{f: f}
	if err := r.load(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *reloader) current() (*tls.Certificate, *x509.CertPool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= recheck {
		r.checked = now
		if r.stampOf() != r.stamp {
			_ = r.loadLocked() // on error keep serving the previous files
		}
	}
	return r.cert, r.pool, nil
}

func (r *reloader) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked = time.Now()
	return r.loadLocked()
}

func (r *reloader) loadLocked() error {
	stamp := r.stampOf()
	var cert *tls.Certificate
	if r.f.Cert != "" {
		c, err := tls.LoadX509KeyPair(r.f.Cert, r.f.Key)
		if err != nil {
			return fmt.Errorf("tls: load %s and %s: %w", r.f.Cert, r.f.Key, err)
		}
		cert = &c
	}
	var pool *x509.CertPool
	if r.f.CA != "" {
		pem, err := os.ReadFile(r.f.CA)
		if err != nil {
			return fmt.Errorf("tls: read CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("tls: %s holds no PEM certificate", r.f.CA)
		}
	}
	r.cert, r.pool, r.stamp = cert, pool, stamp
	return nil
}

// stampOf summarises the files' sizes and modification times.
func (r *reloader) stampOf() string {
	s := ""
	for _, p := range []string{r.f.Cert, r.f.Key, r.f.CA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			s += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return s
}
