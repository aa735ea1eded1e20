package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a running Redis Cluster of masters only, each a redis-server
// with cluster mode on, joined and given all 16384 slots by
// `redis-cli --cluster create`.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the nodes' addresses, the seed list a cluster client takes.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// StartCluster runs a cluster of n masters for tb and stops it when tb
// ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := StartClusterIn(tb.TempDir(), n)
	if err != nil {
		tb.Fatalf("start redis cluster: %v", err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// StartClusterIn runs a cluster of n masters with their files under dir,
// for callers that are not tests; they must call Stop.
func StartClusterIn(dir string, n int) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli not found in PATH: run `make deps` (apt-get install -y redis-server)")
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		nd := filepath.Join(dir, "node-"+strconv.Itoa(i+1))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		bus, err := freePort() // the default bus port, port+10000, may be out of range or taken
		if err != nil {
			c.Stop()
			return nil, err
		}
		s, err := start(nd, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(bus))
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("cluster node %d: %w", i+1, err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// waitOK waits until every node reports cluster_state:ok.
func (c *Cluster) waitOK(ctx context.Context) error {
	for _, n := range c.Nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				cl.Close()
				return fmt.Errorf("cluster node %s not ok: %v %q", n.Addr, ctx.Err(), info)
			case <-time.After(50 * time.Millisecond):
			}
		}
		cl.Close()
	}
	return nil
}
