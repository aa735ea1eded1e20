package mtls

import (
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
		return fmt.Sprintf("%s %s is reachable from the network without mutual TLS: anyone who reaches it can call it", flag, addr), nil
	}
	return "", fmt.Errorf("%s %s is not a loopback address, and without mutual TLS anyone who reaches it could call it: give --tls-cert, --tls-key and --tls-client-ca, bind 127.0.0.1, or pass --insecure", flag, addr)
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
