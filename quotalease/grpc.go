package quotalease

import (
	"context"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// GRPCOptions configure the client's gRPC server interceptors.
type GRPCOptions struct {
	// Bucket is the bucket a call counts against, from its context (its
	// metadata, its peer's certificate) and its full method name; a nil
	// bucket lets the call through undecided. Required: an interceptor
	// without it decides nothing.
	Bucket func(ctx context.Context, fullMethod string) map[string]string
	// Policy names the limit in a refusal's message; empty takes the
	// bucket's "policy" attribute, or "quota".
	Policy string
}

// UnaryInterceptor decides every unary call in-process before its handler
// runs; a refused call ends with ResourceExhausted and a RetryInfo detail
// saying when the same call could fit.
func (c *Client) UnaryInterceptor(opts GRPCOptions) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := c.decideCall(ctx, info.FullMethod, opts); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor decides every stream in-process when it opens, as
// UnaryInterceptor decides a call.
func (c *Client) StreamInterceptor(opts GRPCOptions) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := c.decideCall(ss.Context(), info.FullMethod, opts); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// decideCall is nil for a call that may go, else its ResourceExhausted
// status.
func (c *Client) decideCall(ctx context.Context, method string, opts GRPCOptions) error {
	if opts.Bucket == nil {
		return nil
	}
	bucket := opts.Bucket(ctx, method)
	if bucket == nil {
		return nil
	}
	d := c.AllowN(bucket, 1)
	if d.Allowed {
		return nil
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("policy %s admits no more now; retry after %v",
		nameOf(opts.Policy, bucket), d.RetryAfter))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}
