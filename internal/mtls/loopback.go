package mtls

import (
	"crypto/tls"
	"fmt"
	"net"
)

// CheckExposure refuses to listen on addr without mutual TLS unless addr
// is a loopback address or the operator said insecure: a plaintext,
// unauthenticated listener must never be reachable from the network by
// default. It returns a warning to log when insecure lets it through.
func CheckExposure(flag, addr string, mutual, insecure bool) (warning string, err error) {
	if mutual || addr == "" || IsLoopback(addr) {
		return "", nil
	}
	if insecure {
		return fmt.Sprintf("%s %s is reachable from the network without mutual TLS: anyone who reaches it can "+
			"call it", flag, addr), nil
	}
	return "", fmt.Errorf("%s %s is not a loopback address, and without mutual TLS anyone who reaches it "+
		"could call it: give --tls-cert, --tls-key and --tls-client-ca, bind 127.0.0.1, or pass --insecure", flag, addr)
}

// IsLoopback reports whether host:port binds only loopback interfaces.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Listeners is the TLS set-up of a process's listeners.
type Listeners struct {
	// GRPC requires client certificates (when f.CA is set); HTTP verifies
	// one only if given, for metrics and health. Both nil: plaintext.
	GRPC, HTTP *tls.Config
	// Mutual is whether clients must prove an identity (f has a client CA).
	Mutual bool
}

// SetUp builds the listeners' TLS configurations from f, after checking
// each address in addrs (flag name to address) against CheckExposure; warn
// is told each warning to log.
func SetUp(f Files, addrs map[string]string, insecure bool, warn func(string)) (Listeners, error) {
	l := Listeners{Mutual: f.Cert != "" && f.CA != ""}
	for flag, addr := range addrs {
		w, err := CheckExposure(flag, addr, l.Mutual, insecure)
		if err != nil {
			return Listeners{}, err
		}
		if w != "" {
			warn(w)
		}
	}
	if !f.Enabled() {
		return l, nil
	}
	var err error
	if l.GRPC, err = Server(f); err != nil {
		return Listeners{}, err
	}
	if l.HTTP, err = ServerOptionalClient(f); err != nil {
		return Listeners{}, err
	}
	return l, nil
}
