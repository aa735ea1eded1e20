package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/redistest"
)

// A Redis that requires a password is reached with it from a file, from
// the environment or from the URL; the password never shows in what the
// agent logs or in its errors.
func TestRedisTargetCredentials(t *testing.T) {
	const secret = "s3cret-Pa55"
	srv := redistest.Start(t, "--requirepass", secret)
	ping := func(tg redisTarget) error {
		o, shown, err := tg.options()
		if err != nil {
			return err
		}
		if strings.Contains(shown, secret) {
			t.Fatalf("shown target %q holds the password", shown)
		}
		c := redis.NewClient(o)
		defer c.Close()
		return c.Ping(context.Background()).Err()
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ping(redisTarget{addr: srv.Addr, passwordFile: file}); err != nil {
		t.Fatalf("password from a file: %v", err)
	}
	if err := ping(redisTarget{addr: "redis://:" + secret + "@" + srv.Addr + "/0"}); err != nil {
		t.Fatalf("password in the URL: %v", err)
	}
	t.Setenv("QUOTALEASE_REDIS_PASSWORD", secret)
	if err := ping(redisTarget{addr: srv.Addr}); err != nil {
		t.Fatalf("password from the environment: %v", err)
	}
	t.Setenv("QUOTALEASE_REDIS_PASSWORD", "")
	if err := ping(redisTarget{addr: srv.Addr}); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("no password: %v, want NOAUTH", err)
	}
	_, _, err := redisTarget{addr: "redis://:" + secret + "@" + srv.Addr + "/notadb"}.options()
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("bad URL error %v: want an error without the password", err)
	}
	if _, _, err := (redisTarget{addr: srv.Addr, passwordFile: "/nonexistent"}).options(); err == nil || !strings.Contains(err.Error(), "--redis-password-file") {
		t.Fatalf("missing password file: %v", err)
	}
}
