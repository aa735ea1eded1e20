package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/mtls"
)

// DebugFlagHelp is the help of both binaries' --debug-listen.
const DebugFlagHelp = "address of a debug listener serving Go's runtime profiles (CPU, heap, goroutines: " +
	"net/http/pprof) under /debug/pprof/, as envoyproxy/ratelimit's debug port does; empty: none. It has no " +
	"authentication: keep it on loopback and reach it with kubectl port-forward or ssh"

// Debug is where a process serves Go's runtime profiles (net/http/pprof)
// under /debug/pprof/, for an operator profiling it while it runs.
type Debug struct {
	// Addr is the listener's address; "" serves nothing.
	Addr string
	// Insecure lets an address that is not loopback through, with a
	// warning: the listener has no authentication.
	Insecure bool
}

// Check refuses an address that is not loopback unless d.Insecure (then
// it logs a warning): the listener has no authentication. Call it with
// the other flags' checks, before anything starts.
func (d Debug) Check(log hclog.Logger) error {
	switch {
	case d.Addr == "" || mtls.IsLoopback(d.Addr):
		return nil
	case !d.Insecure:
		return fmt.Errorf("--debug-listen %s is not a loopback address, and the debug listener has no "+
			"authentication: bind 127.0.0.1 and reach it with kubectl port-forward or ssh, or pass --insecure", d.Addr)
	}
	log.Warn("--debug-listen is reachable from the network without authentication: anyone who reaches it "+
		"can profile this process", "debug_listen", d.Addr)
	return nil
}

// Serve serves d (checked by Check) until stop is called; Addr "" serves
// nothing. Its server has no write timeout: a CPU profile lasts the
// ?seconds=N it is asked for.
func (d Debug) Serve(log hclog.Logger) (stop func(), err error) {
	if d.Addr == "" {
		return func() {}, nil
	}
	l, err := net.Listen("tcp", d.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (choose another with --debug-listen)", d.Addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("the debug listener stopped", "error", err)
		}
	}()
	log.Info("serving runtime profiles", "debug_listen", l.Addr().String())
	return func() { srv.Close() }, nil
}
