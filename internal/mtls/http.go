package mtls

import "net/http"

// RequireClientCert wraps h so that a request without a verified client
// certificate gets 401, except on the paths listed open (metrics and
// health, which scrapers and probes reach without one). Use it behind a
// listener configured with ServerOptionalClient.
func RequireClientCert(h http.Handler, open ...string) http.Handler {
	free := map[string]bool{}
	for _, p := range open {
		free[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !free[r.URL.Path] && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			http.Error(w, "a client certificate signed by the agent's --tls-client-ca is required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
