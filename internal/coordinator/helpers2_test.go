package coordinator

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
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

// listPolicies lists the policies through cl.Call, so that the call takes
// cl's routing (its order of replicas, suspects, leader hints and pinned
// cluster id) as the admin CLI's calls do: what the client tests exercise.
func listPolicies(ctx context.Context, cl *leaseapi.Client) error {
	return cl.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		_, err := pb.NewAdminServiceClient(cc).ListPolicies(ctx, &pb.ListPoliciesRequest{}, opts...)
		return err
	})
}

// setPolicyVia stores yaml through cl.Call, routed as listPolicies is.
func setPolicyVia(ctx context.Context, cl *leaseapi.Client, yaml string) error {
	return cl.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		_, err := pb.NewAdminServiceClient(cc).SetPolicy(ctx, &pb.SetPolicyRequest{Yaml: yaml}, opts...)
		return err
	})
}
