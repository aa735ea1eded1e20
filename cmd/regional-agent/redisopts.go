package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisUsage lists the forms --redis takes.
const redisUsage = `the region's Redis, one of:
  host:port
      one node
  redis://[user[:password]@]host:port[/db]
      one node (rediss:// for TLS)
  redis+cluster://[user[:password]@]host:port,...
      Redis Cluster: any nodes as seeds (rediss+cluster:// for TLS)
  redis+sentinel://[user[:password]@]host:port,.../master[/db]
      Sentinel: the sentinels and the master's name (rediss+sentinel:// for TLS); the
      password is the data nodes', the sentinels' comes from --redis-sentinel-password-file
      or QUOTALEASE_REDIS_SENTINEL_PASSWORD`

// redisTarget is how the agent reaches its region's Redis, from --redis
// (host:port, or a redis://, rediss://, redis+cluster:// or
// redis+sentinel:// URL) and the secret-bearing flags, which never appear
// in logs or errors.
type redisTarget struct {
	addr                 string // --redis
	passwordFile         string // --redis-password-file
	sentinelPasswordFile string // --redis-sentinel-password-file
	caFile               string // --redis-tls-ca
}

// options returns the client options (redis.NewUniversalClient makes the
// single-node, cluster or Sentinel client they describe), and the target
// as it may be shown (user and password removed).
func (t redisTarget) options() (*redis.UniversalOptions, string, error) {
	o, shown, err := parseRedisTarget(t.addr)
	if err != nil {
		return nil, "", err
	}
	if pw := os.Getenv("QUOTALEASE_REDIS_PASSWORD"); pw != "" {
		o.Password = pw
	}
	if t.passwordFile != "" {
		if o.Password, err = readSecret("--redis-password-file", t.passwordFile); err != nil {
			return nil, "", err
		}
	}
	if pw := os.Getenv("QUOTALEASE_REDIS_SENTINEL_PASSWORD"); pw != "" {
		o.SentinelPassword = pw
	}
	if t.sentinelPasswordFile != "" {
		if o.MasterName == "" {
			return nil, "", fmt.Errorf("--redis-sentinel-password-file: --redis %s is not a redis+sentinel:// URL", shown)
		}
		if o.SentinelPassword, err = readSecret("--redis-sentinel-password-file", t.sentinelPasswordFile); err != nil {
			return nil, "", err
		}
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
			host, _, _ := net.SplitHostPort(o.Addrs[0])
			o.TLSConfig = &tls.Config{ServerName: host}
		}
		o.TLSConfig.RootCAs = pool
	}
	if o.TLSConfig != nil {
		o.TLSConfig.MinVersion = tls.VersionTLS12
	}
	// Decisions must never be retried blindly (a retry may charge twice);
	// every call is bounded by its context. A cluster client still follows
	// MOVED and ASK redirections, which run nothing twice.
	o.MaxRetries, o.ContextTimeoutEnabled = -1, true
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolSize = time.Second, time.Second, time.Second, 64
	return o, shown, nil
}

// parseRedisTarget parses --redis without the secrets that come from
// elsewhere. Errors never contain the password.
func parseRedisTarget(addr string) (*redis.UniversalOptions, string, error) {
	scheme, rest, isURL := strings.Cut(addr, "://")
	if !isURL {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, "", fmt.Errorf("--redis %q: want host:port or a URL; %s", addr, redisUsage)
		}
		return &redis.UniversalOptions{Addrs: []string{addr}}, addr, nil
	}
	switch scheme {
	case "redis", "rediss":
		o, err := redis.ParseURL(addr)
		if err != nil {
			return nil, "", fmt.Errorf("--redis %s: %s", redactURL(scheme, rest), strings.ReplaceAll(err.Error(), addr, "<url>"))
		}
		opts := &redis.UniversalOptions{
			Addrs:     []string{o.Addr},
			Username:  o.Username,
			Password:  o.Password,
			DB:        o.DB,
			TLSConfig: o.TLSConfig,
		}
		return opts, redactURL(scheme, rest), nil
	case "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
	default:
		return nil, "", fmt.Errorf("--redis: unknown scheme %q; %s", scheme, redisUsage)
	}
	shown := redactURL(scheme, rest)
	var user *url.Userinfo
	authority, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		u, err := url.Parse("x://" + authority[:at+1] + "h")
		if err != nil || u.User == nil {
			return nil, "", fmt.Errorf("--redis %s: the user and password are not valid URL userinfo "+
				"(percent-escape special characters)", shown)
		}
		user, authority = u.User, authority[at+1:]
	}
	sentinel := strings.HasSuffix(scheme, "+sentinel")
	defPort := "6379"
	if sentinel {
		defPort = "26379"
	}
	o := &redis.UniversalOptions{}
	for _, h := range strings.Split(authority, ",") {
		if h == "" {
			return nil, "", fmt.Errorf("--redis %s: an empty address in the host list", shown)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, defPort)
		}
		o.Addrs = append(o.Addrs, h)
	}
	if user != nil {
		o.Username = user.Username()
		o.Password, _ = user.Password()
	}
	if strings.HasPrefix(scheme, "rediss") {
		host, _, _ := net.SplitHostPort(o.Addrs[0])
		o.TLSConfig = &tls.Config{ServerName: host}
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if !sentinel {
		if path != "" {
			return nil, "", fmt.Errorf("--redis %s: a cluster URL takes no path (Redis Cluster has only database 0)", shown)
		}
		o.IsClusterMode = true
		return o, shown, nil
	}
	if parts[0] == "" || len(parts) > 2 {
		return nil, "", fmt.Errorf("--redis %s: name the master after the sentinels: "+
			"redis+sentinel://host:port,.../master[/db]", shown)
	}
	o.MasterName = parts[0]
	if len(parts) == 2 {
		db, err := strconv.Atoi(parts[1])
		if err != nil || db < 0 {
			return nil, "", fmt.Errorf("--redis %s: database %q is not a number", shown, parts[1])
		}
		o.DB = db
	}
	return o, shown, nil
}

// redactURL is scheme://rest without the user and password.
func redactURL(scheme, rest string) string {
	authority, path, hasPath := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		authority = authority[at+1:]
	}
	if hasPath {
		authority += "/" + path
	}
	return scheme + "://" + authority
}

// readSecret reads a password from a file named by flag, without its
// trailing newline.
func readSecret(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
