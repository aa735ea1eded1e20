package coordinator

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

type grpcConn = *grpc.ClientConn

func clientWithPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }

func mustConnAddr(t *testing.T, addr string) *grpc.ClientConn {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
