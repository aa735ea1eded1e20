package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the test Sentinel monitors its master under.
const MasterName = "quota-lease"

// Sentinel is a master, a replica of it and one Sentinel watching them
// (quorum 1), all real redis-server processes: kill the master and the
// Sentinel promotes the replica within a few seconds.
type Sentinel struct {
	Master, Replica *Server
	// Sentinel is the redis-server running in sentinel mode.
	Sentinel *Server
}

// StartSentinel runs a Sentinel deployment for tb and stops it when tb
// ends.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	s, err := StartSentinelIn(tb.TempDir())
	if err != nil {
		tb.Fatalf("start redis sentinel: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// StartSentinelIn runs a Sentinel deployment with its files under dir, for
// callers that are not tests; they must call Stop.
func StartSentinelIn(dir string) (*Sentinel, error) {
	s := &Sentinel{}
	sub := func(name string) (string, error) {
		d := filepath.Join(dir, name)
		return d, os.MkdirAll(d, 0o755)
	}
	d, err := sub("master")
	if err != nil {
		return nil, err
	}
	if s.Master, err = start(d, "--repl-diskless-sync-delay", "0"); err != nil { // sync a replica at once
		return nil, fmt.Errorf("sentinel's master: %w", err)
	}
	host, port := splitAddr(s.Master.Addr)
	if d, err = sub("replica"); err == nil {
		s.Replica, err = start(d, "--replicaof", host, port, "--repl-diskless-sync-delay", "0")
	}
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("sentinel's replica: %w", err)
	}
	if d, err = sub("sentinel"); err != nil {
		s.Stop()
		return nil, err
	}
	// Sentinel rewrites its configuration file, so it must be its own.
	conf := filepath.Join(d, "sentinel.conf")
	// known-replica spares the Sentinel its first INFO round (10 s) to
	// discover the replica.
	rhost, rport := splitAddr(s.Replica.Addr)
	body := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\nsentinel down-after-milliseconds %[1]s "+
		"1000\nsentinel failover-timeout %[1]s 5000\nsentinel parallel-syncs %[1]s 1\nsentinel known-replica "+
		"%[1]s %[4]s %[5]s\n",
		MasterName, host, port, rhost, rport)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		s.Stop()
		return nil, err
	}
	if s.Sentinel, err = startConf(d, conf, "--sentinel"); err != nil {
		s.Stop()
		return nil, fmt.Errorf("sentinel: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.waitReplicating(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Stop kills every process.
func (s *Sentinel) Stop() {
	for _, p := range []*Server{s.Sentinel, s.Replica, s.Master} {
		if p != nil {
			p.Stop()
		}
	}
}

// CurrentMaster asks the Sentinel which address is the master now.
func (s *Sentinel) CurrentMaster(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr, MaxRetries: -1})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, MasterName).Result()
	if err != nil {
		return "", fmt.Errorf("ask sentinel for %s: %w", MasterName, err)
	}
	return hp[0] + ":" + hp[1], nil
}

// waitReplicating waits until the replica is in sync with the master and
// the Sentinel lists it, so that a failover has somewhere to go.
func (s *Sentinel) waitReplicating(ctx context.Context) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr, MaxRetries: -1})
	defer sc.Close()
	rc := redis.NewClient(&redis.Options{Addr: s.Replica.Addr, MaxRetries: -1})
	defer rc.Close()
	for {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			rs, err := sc.Replicas(ctx, MasterName).Result()
			if err == nil && len(rs) > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replica never came in sync under the sentinel: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
