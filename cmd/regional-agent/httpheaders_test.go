package main

import (
	"io"
	"strings"
	"testing"

	"github.com/quota-lease/quota-lease/httplimit"
	"github.com/quota-lease/quota-lease/internal/agent"
)

// --http-ratelimit-headers (or QUOTALEASE_HTTP_RATELIMIT_HEADERS) reaches
// the agent's configuration, draft-06 by default; a version the agent does
// not know is refused with the setting named.
func TestHTTPRateLimitHeadersFlag(t *testing.T) {
	chosen := func(args ...string) (string, error) {
		o, err := serveFlags(append([]string{"--region", "us"}, args...), io.Discard)
		if err != nil {
			return "", err
		}
		sc, err := o.config(io.Discard)
		if err != nil {
			return "", err
		}
		return sc.agent.HTTPRateLimitHeaders, agent.ValidateConfig(sc.agent)
	}
	if got, _ := chosen(); got != httplimit.Draft06 {
		t.Errorf("default %q, want %q", got, httplimit.Draft06)
	}
	if got, _ := chosen("--http-ratelimit-headers", "draft-11"); got != httplimit.Draft11 {
		t.Errorf("--http-ratelimit-headers draft-11: %q", got)
	}
	t.Setenv("QUOTALEASE_HTTP_RATELIMIT_HEADERS", "none")
	if got, _ := chosen(); got != httplimit.None {
		t.Errorf("from the environment: %q, want none", got)
	}
	if _, err := chosen("--http-ratelimit-headers", "draft-12"); err == nil || !strings.Contains(err.Error(), `http ratelimit headers "draft-12": use draft-06, draft-11 or none`) {
		t.Errorf("draft-12: %v", err)
	}
}
