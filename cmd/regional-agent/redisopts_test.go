package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
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
		c := redis.NewUniversalClient(o)
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

// Every form of --redis parses to the client it names; bad ones are
// refused with a message that never holds the password.
func TestParseRedisTarget(t *testing.T) {
	for _, c := range []struct {
		in      string
		addrs   string
		cluster bool
		master  string
		db      int
		tls     bool
		shown   string
	}{
		{in: "10.0.0.1:6379", addrs: "10.0.0.1:6379", shown: "10.0.0.1:6379"},
		{in: "redis://u:pw@r1:6380/2", addrs: "r1:6380", db: 2, shown: "redis://r1:6380/2"},
		{in: "rediss://r1:6380", addrs: "r1:6380", tls: true, shown: "rediss://r1:6380"},
		{in: "redis+cluster://:pw@n1:7000,n2:7001,n3", addrs: "n1:7000,n2:7001,n3:6379", cluster: true, shown: "redis+cluster://n1:7000,n2:7001,n3"},
		{in: "rediss+cluster://n1:7000", addrs: "n1:7000", cluster: true, tls: true, shown: "rediss+cluster://n1:7000"},
		{in: "redis+sentinel://s1,s2:26380/mymaster", addrs: "s1:26379,s2:26380", master: "mymaster", shown: "redis+sentinel://s1,s2:26380/mymaster"},
		{in: "redis+sentinel://u:p%40ss@s1:26379/mymaster/3", addrs: "s1:26379", master: "mymaster", db: 3, shown: "redis+sentinel://s1:26379/mymaster/3"},
	} {
		o, shown, err := parseRedisTarget(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if got := strings.Join(o.Addrs, ","); got != c.addrs || o.IsClusterMode != c.cluster || o.MasterName != c.master || o.DB != c.db || (o.TLSConfig != nil) != c.tls || shown != c.shown {
			t.Errorf("%s: addrs %s cluster %v master %q db %d tls %v shown %q", c.in, got, o.IsClusterMode, o.MasterName, o.DB, o.TLSConfig != nil, shown)
		}
	}
	for _, bad := range []string{"nohost", "redis+cluster://:s3cret@n1/0", "redis+sentinel://:s3cret@s1", "redis+sentinel://:s3cret@s1/m/x",
		"redis+sentinel://:s3cret@s1,,s2/m", "memcached://:s3cret@h:1", "redis://:s3cret@h:1/notadb"} {
		_, _, err := parseRedisTarget(bad)
		if err == nil {
			t.Errorf("%s: accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: error %q holds the password", bad, err)
		}
	}
}

// A cluster URL and a Sentinel URL reach real deployments: the cluster
// through any seed node, the master through the Sentinel, with the data
// nodes' password from the URL.
func TestRedisTargetClusterAndSentinel(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	o, _, err := redisTarget{addr: "redis+cluster://" + cl.Addrs()[1]}.options()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewUniversalClient(o)
	defer c.Close()
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("a cluster URL made a %T", c)
	}
	for i := 0; i < 20; i++ { // keys spread over every node
		if err := c.Set(ctx, "k"+strings.Repeat("x", i), i, 0).Err(); err != nil {
			t.Fatalf("set through the cluster client: %v", err)
		}
	}
	s := redistest.StartSentinel(t)
	o, _, err = redisTarget{addr: "redis+sentinel://" + s.Sentinel.Addr + "/" + redistest.MasterName}.options()
	if err != nil {
		t.Fatal(err)
	}
	f := redis.NewUniversalClient(o)
	defer f.Close()
	if err := f.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set through the sentinel client: %v", err)
	}
	if v := s.Master.Client(t).Get(ctx, "k").Val(); v != "v" {
		t.Fatalf("the master holds %q: the sentinel URL did not lead to it", v)
	}
}

// serve -h shows the forms --redis takes as laid out, every line whole:
// the table fits the width cli.PrintFlags wraps descriptions to, so the
// wrapping never splits a form from its description.
func TestServeHelpKeepsRedisForms(t *testing.T) {
	var help bytes.Buffer
	serveFlags([]string{"-h"}, &help)
	for _, line := range strings.Split(redisUsage, "\n") {
		shown := "    \t" + line
		if !strings.Contains(help.String(), shown+"\n") && !strings.Contains(help.String(), shown+" (default") {
			t.Errorf("serve -h does not show the --redis line %q whole:\n%s", line, help.String())
		}
	}
}
