package agent

import (
	"context"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Envoy's global rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), so Envoy
// or any client of that API uses the agent unchanged.
//
// Each descriptor is one check. Its entry keyed "policy" (or Envoy's
// generic_key, as set by a generic_key action) names the policy; every
// other entry is a request attribute, its key the attribute's name, except
// remote_address, which is the attribute ip. hits_addend is the cost (0
// means the policy's default). The answer is OVER_LIMIT if any descriptor
// is over its limit.
type envoyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	a *Agent
}

func registerEnvoy(s *grpc.Server, a *Agent) {
	rlsv3.RegisterRateLimitServiceServer(s, &envoyServer{a: a})
}

// envoyAttribute renames Envoy's descriptor keys to attribute names.
var envoyAttribute = map[string]string{"remote_address": "ip"}

func (s *envoyServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if len(req.Descriptors) == 0 || len(req.Descriptors) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "a request holds 1-%d descriptors, got %d", MaxBatch, len(req.Descriptors))
	}
	ins := make([]Input, len(req.Descriptors))
	for i, d := range req.Descriptors {
		in := Input{Attributes: map[string]string{}, Cost: int64(req.HitsAddend)}
		for _, e := range d.Entries {
			switch e.Key {
			case "policy", "generic_key":
				in.Policy = e.Value
			default:
				name := e.Key
				if n, ok := envoyAttribute[name]; ok {
					name = n
				}
				in.Attributes[name] = e.Value
			}
		}
		if in.Policy == "" {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d names no policy: add an entry keyed policy or generic_key", i)
		}
		ins[i] = in
	}
	res := s.a.CheckBatch(ctx, ins)
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i, r := range res {
		if r.Err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, r.Err)
		}
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:       envoyLimit(r.Outcome),
			LimitRemaining:     uint32(min(r.RemainingUnits(), int64(^uint32(0)))),
			DurationUntilReset: durationpb.New(time.Duration(r.ResetAfterMs) * time.Millisecond)}
		if !r.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "retry-after", Value: retryAfterSeconds(r.RetryAfterMs)})
		}
		out.Statuses = append(out.Statuses, st)
	}
	return out, nil
}

// envoyLimit expresses the enforced limit in Envoy's units, choosing the
// unit that matches the policy's period, or requests per second.
func envoyLimit(o Outcome) *rlsv3.RateLimitResponse_RateLimit {
	limit := enforcedLimit(o)
	period := time.Duration(o.Policy.Period)
	units := []struct {
		d time.Duration
		u rlsv3.RateLimitResponse_RateLimit_Unit
	}{{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND}, {time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR}, {24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY}}
	for _, u := range units {
		if period == u.d {
			return &rlsv3.RateLimitResponse_RateLimit{Name: o.Policy.Name, RequestsPerUnit: uint32(limit), Unit: u.u}
		}
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: o.Policy.Name, RequestsPerUnit: uint32(limit / period.Seconds()), Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
}
