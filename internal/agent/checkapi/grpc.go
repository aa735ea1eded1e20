package checkapi

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/admission"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// checkServer serves quotalease.v1.CheckService.
type checkServer struct {
	pb.UnimplementedCheckServiceServer
	api *Server
}

func (s *checkServer) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	o, err := s.api.c.Checker.Check(ctx, input(req))
	if err != nil && !admission.IsInputError(err) { // nothing decided it: not the caller's fault
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return response(o), nil
}

func (s *checkServer) CheckBatch(ctx context.Context, req *pb.CheckBatchRequest) (*pb.CheckBatchResponse, error) {
	if len(req.Checks) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "a batch holds at most %d checks, got %d", MaxBatch, len(req.Checks))
	}
	ins := make([]admission.Request, len(req.Checks))
	for i, c := range req.Checks {
		ins[i] = input(c)
	}
	res := s.api.c.Checker.CheckBatch(ctx, ins)
	out := &pb.CheckBatchResponse{Results: make([]*pb.CheckResult, len(res))}
	for i, r := range res {
		if r.Err != nil {
			out.Results[i] = &pb.CheckResult{Error: r.Err.Error()}
			continue
		}
		out.Results[i] = &pb.CheckResult{Response: response(r.Outcome)}
	}
	return out, nil
}

func input(r *pb.CheckRequest) admission.Request {
	return admission.Request{Policy: r.Policy, Attributes: r.Attributes, Cost: r.Cost, IdempotencyKey: r.IdempotencyKey,
		Check: r.Check, Reserve: r.Reserve, Settle: r.Settle}
}

func response(o admission.Outcome) *pb.CheckResponse {
	return &pb.CheckResponse{
		Allowed:      o.Allowed,
		Remaining:    o.RemainingUnits(),
		RetryAfterMs: o.RetryAfterMs,
		ResetMs:      o.ResetAfterMs,
		Policy:       o.Policy.Name,
		Mode:         string(o.Mode),
		Limit:        enforcedLimit(o),
		PeriodMs:     time.Duration(o.Policy.Period).Milliseconds(),
		Replayed:     o.Replayed,
		Shadow:       o.Shadow,
		Reservation:  o.Reservation,
	}
}

// Register adds the check service and Envoy's rate-limit service to g.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterCheckServiceServer(g, &checkServer{api: s})
	rlsv3.RegisterRateLimitServiceServer(g, &envoyServer{api: s})
}
