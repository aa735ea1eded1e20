package mtls

import (
	"flag"
	"os"
)

// ServerFlags registers a listener's TLS flags on fs: --tls-cert,
// --tls-key and --tls-client-ca.
func ServerFlags(fs *flag.FlagSet) *Files {
	f := &Files{}
	fs.StringVar(&f.Cert, "tls-cert", "",
		"PEM certificate (chain) the listeners serve; with --tls-key turns TLS 1.3 on. Re-read when the file "+
			"changes")
	fs.StringVar(&f.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.CA, "tls-client-ca", "",
		"PEM CA that signs client certificates; with it every client must present one (mutual TLS) and calls "+
			"are authorized by its identity")
	return f
}

// ClientFlags registers a client's TLS flags on fs with the given prefix
// ("" or e.g. "coordinator-"): --<prefix>tls-ca, --<prefix>tls-cert and
// --<prefix>tls-key, defaulting to the environment variables
// QUOTALEASE_TLS_CA, QUOTALEASE_TLS_CERT and QUOTALEASE_TLS_KEY.
func ClientFlags(fs *flag.FlagSet, prefix string) *Files {
	f := &Files{}
	fs.StringVar(&f.CA, prefix+"tls-ca", os.Getenv("QUOTALEASE_TLS_CA"),
		"PEM CA that signs the coordinators' certificates; turns TLS 1.3 on (env QUOTALEASE_TLS_CA)")
	fs.StringVar(&f.Cert, prefix+"tls-cert", os.Getenv("QUOTALEASE_TLS_CERT"),
		"PEM client certificate naming this caller's identity (env QUOTALEASE_TLS_CERT)")
	fs.StringVar(&f.Key, prefix+"tls-key", os.Getenv("QUOTALEASE_TLS_KEY"),
		"PEM private key of the client certificate (env QUOTALEASE_TLS_KEY)")
	return f
}
