// Package devca makes throwaway certificate authorities and the
// certificates the tests, the demo and a development setup need: an ECDSA
// P-256 CA and leaf certificates with loopback names and SPIFFE URI SANs,
// written as PEM files. The CA's key is kept beside it, so more
// certificates can be issued later (Load).
package devca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority whose files live in Dir.
type CA struct {
	Dir string
	// CertFile is the CA certificate's PEM file, what peers trust.
	CertFile string
	// KeyFile is the CA's private key (owner-only), with which Load makes
	// the CA again to issue more certificates later.
	KeyFile string
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// files are the CA certificate's and key's file names in dir.
func files(dir, name string) (cert, key string) {
	return filepath.Join(dir, name+"-ca.pem"), filepath.Join(dir, name+"-ca-key.pem")
}

// Load reads the CA named name that New wrote into dir, to issue more
// certificates from it.
func Load(dir, name string) (*CA, error) {
	certFile, keyFile := files(dir, name)
	cert, err := readPEM(certFile, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(cert)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", certFile, err)
	}
	kder, err := readPEM(keyFile, "PRIVATE KEY")
	if err != nil {
		return nil, fmt.Errorf("%w (a CA made before its key was kept cannot issue more: make a new set)", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kder)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", keyFile, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(c.PublicKey) {
		return nil, fmt.Errorf("%s is not the key of %s", keyFile, certFile)
	}
	return &CA{Dir: dir, CertFile: certFile, KeyFile: keyFile, cert: c, key: key}, nil
}

// readPEM returns the DER bytes of the first block of type typ in path.
func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("%s holds no PEM %s", path, typ)
		}
		if blk.Type == typ {
			return blk.Bytes, nil
		}
	}
}

// New makes a CA named name with its files in dir: the certificate and
// its key (owner-only).
func New(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, cert: cert, key: key}
	ca.CertFile, ca.KeyFile = files(dir, name)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := writePEM(ca.KeyFile, "PRIVATE KEY", kder); err != nil {
		return nil, err
	}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	// Name names the files (<name>.pem, <name>-key.pem) and the subject.
	Name string
	// URIs are SANs such as spiffe://quota-lease/region/us.
	URIs []*url.URL
	// NotAfter defaults to a year from now; a past time makes an expired
	// certificate.
	NotAfter time.Time
	// Hosts are DNS names or IP addresses the certificate serves besides
	// localhost and the loopback addresses.
	Hosts []string
}

// Issue signs a leaf certificate valid for localhost, the loopback
// addresses and l.Hosts (as a server and as a client) and writes it; it
// returns the two file names.
func (ca *CA) Issue(l Leaf) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	notAfter := l.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	notBefore := time.Now().Add(-time.Hour)
	if notAfter.Before(notBefore) {
		notBefore = notAfter.Add(-time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.Name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		URIs:         l.URIs,
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(ca.Dir, l.Name+".pem"), filepath.Join(ca.Dir, l.Name+"-key.pem")
	if err := writePEM(keyFile, "PRIVATE KEY", kder); err != nil {
		return "", "", err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writePEM writes one PEM block atomically (a temporary file renamed), so
// a reader never sees half a file; keys are readable by the owner only.
func writePEM(path, typ string, der []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := pem.Encode(tmp, &pem.Block{Type: typ, Bytes: der}); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}
