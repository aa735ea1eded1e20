package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
)

// ensureClusterID loads the deployment's cluster ID from etcd, making it
// at the first start of the first replica (created only if absent, so
// replicas starting together agree).
func (c *Coordinator) ensureClusterID(ctx context.Context) error {
	if c.clusterID.Load() != nil {
		return nil
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	key := c.keys.clusterID()
	var resp *clientv3.GetResponse
	err := c.etcdCall(ctx, "make or read the cluster ID", func(ctx context.Context) error {
		_, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, hex.EncodeToString(b))).
			Commit()
		if err != nil {
			return err
		}
		resp, err = c.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster id: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("cluster id: key %s is missing right after it was written (is another process "+
			"deleting under --prefix?)", key)
	}
	id := string(resp.Kvs[0].Value)
	c.clusterID.Store(&id)
	c.log.Info("cluster", "id", id)
	return nil
}

// ClusterID is the deployment's cluster ID, or "" before it is loaded.
func (c *Coordinator) ClusterID() string {
	if p := c.clusterID.Load(); p != nil {
		return *p
	}
	return ""
}

// checkCluster is a unary interceptor: it stamps every answer with the
// cluster ID and refuses, before the handler, a call that expects
// another cluster.
func (c *Coordinator) checkCluster(
	ctx context.Context,
	req any,
	info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler,
) (any, error) {
	id := c.ClusterID()
	if id == "" {
		return handler(ctx, req)
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(leaseapi.ClusterHeader, id))
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if want := md.Get(leaseapi.ClusterHeader); len(want) > 0 && want[0] != id {
			return nil, status.Errorf(codes.FailedPrecondition,
				"this coordinator serves cluster %s, not %s: the address belongs to another deployment (a stale "+
					"--coordinator address or leader hint)", id, want[0])
		}
	}
	return handler(ctx, req)
}
