package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisTarget is how the agent reaches its region's Redis, from --redis
// (host:port, or a redis:// or rediss:// URL) and the secret-bearing
// flags, which never appear in logs or errors.
type redisTarget struct {
	addr         string // --redis
	passwordFile string // --redis-password-file
	caFile       string // --redis-tls-ca
}

// options returns the client options, and the target as it may be shown
// (user and password removed).
func (t redisTarget) options() (*redis.Options, string, error) {
	var o *redis.Options
	shown := t.addr
	if strings.Contains(t.addr, "://") {
		u, err := url.Parse(t.addr)
		if err != nil {
			return nil, "", fmt.Errorf("--redis: not a URL (redis://[user:password@]host:port[/db] or rediss://...)")
		}
		if o, err = redis.ParseURL(t.addr); err != nil {
			u.User = nil
			return nil, "", fmt.Errorf("--redis %s: %v", u.Redacted(), redactErr(err, t.addr))
		}
		u.User = nil
		shown = u.String()
	} else {
		o = &redis.Options{Addr: t.addr}
	}
	if pw := os.Getenv("QUOTALEASE_REDIS_PASSWORD"); pw != "" {
		o.Password = pw
	}
	if t.passwordFile != "" {
		b, err := os.ReadFile(t.passwordFile)
		if err != nil {
			return nil, "", fmt.Errorf("--redis-password-file: %w", err)
		}
		o.Password = strings.TrimRight(string(b), "\r\n")
	}
	if t.caFile != "" {
		pem, err := os.ReadFile(t.caFile)
		if err != nil {
			return nil, "", fmt.Errorf("--redis-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("--redis-tls-ca %s holds no PEM certificate", t.caFile)
		}
		if o.TLSConfig == nil {
			host := o.Addr
			if i := strings.LastIndex(host, ":"); i >= 0 {
				host = host[:i]
			}
			o.TLSConfig = &tls.Config{ServerName: host}
		}
		o.TLSConfig.RootCAs, o.TLSConfig.MinVersion = pool, tls.VersionTLS12
	}
	// Decisions must never be retried blindly (a retry may charge twice);
	// every call is bounded by its context.
	o.MaxRetries, o.ContextTimeoutEnabled = -1, true
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolSize = time.Second, time.Second, time.Second, 64
	return o, shown, nil
}

// redactErr removes the URL (and so any password in it) from err's text.
func redactErr(err error, secret string) string {
	return strings.ReplaceAll(err.Error(), secret, "<url>")
}
