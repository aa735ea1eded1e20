package cluster

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// ConsoleProxy serves the leading coordinator's web console on a loopback
// address without TLS, presenting the viewer certificate to the
// coordinator, so that a browser on this machine can open it: the demo
// prints its URL and the browser test drives it. It follows the leader
// across failovers (looked up at most once a second; a follower's console
// when none leads). stop closes it.
func (c *Cluster) ConsoleProxy() (base string, stop func(), err error) {
	viewer, err := c.ClientTLS("viewer")
	if err != nil {
		return "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var (
		mu     sync.Mutex
		target *Process
		looked time.Time
	)
	pick := func(ctx context.Context) *Process {
		mu.Lock()
		defer mu.Unlock()
		if target == nil || time.Since(looked) > time.Second {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if target = c.Leader(ctx); target == nil {
				target = c.Coords[0]
			}
			looked = time.Now()
		}
		return target
	}
	transport := &http.Transport{TLSClientConfig: viewer}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			u, _ := url.Parse(pick(r.In.Context()).HTTP)
			r.SetURL(u)
		},
		Transport: transport,
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(lis)
	return "http://" + lis.Addr().String(), func() { srv.Close(); transport.CloseIdleConnections() }, nil
}
