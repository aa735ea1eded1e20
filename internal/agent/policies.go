package agent

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// PoliciesFromCoordinator loads the policy set from the coordinator's admin
// API (any replica answers), the normal source.
func PoliciesFromCoordinator(cl *leaseapi.Client) func(ctx context.Context) ([]*policy.Policy, error) {
	return func(ctx context.Context) ([]*policy.Policy, error) {
		var resp *pb.ListPoliciesResponse
		err := cl.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) (err error) {
			resp, err = pb.NewAdminServiceClient(cc).ListPolicies(ctx, &pb.ListPoliciesRequest{}, opts...)
			return err
		})
		if err != nil {
			return nil, err
		}
		ps, err := leaseapi.DecodePolicies(resp.Policies)
		if err != nil {
			return nil, fmt.Errorf("from the coordinator: %w", err)
		}
		return ps, nil
	}
}

// PoliciesFromFile loads the policy set from a YAML file, for an agent
// whose policies are all region-scoped or that runs without a coordinator.
func PoliciesFromFile(path string) func(ctx context.Context) ([]*policy.Policy, error) {
	return func(context.Context) ([]*policy.Policy, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return policy.ParsePolicyFile(data)
	}
}
