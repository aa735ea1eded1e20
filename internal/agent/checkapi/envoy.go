package checkapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Envoy's global rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), with the
// semantics of envoyproxy/ratelimit, so Envoy or any client of that API
// uses the agent unchanged and gets the same answers (envoyAnswer).
//
// Each descriptor is one check. In a domain loaded from an
// envoyproxy/ratelimit configuration (policy.ParseEnvoyConfig) the
// descriptor's entries pick the policy as that service does (EnvoyIndex),
// and a matched limit whose configured name another matched limit in the
// same request replaces is not applied. Otherwise its entry keyed "policy"
// (or Envoy's generic_key, as set by a generic_key action) names the
// policy. Every other entry is a request attribute named by
// policy.EnvoyAttribute (remote_address is ip). A descriptor's
// hits_addend, else the request's, is the cost (the request's 0 means the
// policy's default); a descriptor's hits_addend set to 0 is a pure check
// (admission.Request.Check: OVER_LIMIT once the limit's count exceeds it,
// nothing charged), as Envoy Gateway sends before a response whose cost
// it charges when the response ends; with is_negative_hits the descriptor
// returns that many hits instead (admission.Request.Return; envoyreturns.go).
//
// Descriptors are answered one by one, never by failing the call: Envoy
// turns a failed call into "allow" (failure_mode_deny: false), so one odd
// descriptor would switch limiting off for all of them. A descriptor that
// names no known policy, or lacks an attribute its policy counts by, is
// OK with no limit, as envoyproxy/ratelimit answers an unmatched one; a
// value longer than regional.MaxAttributeValueBytes is counted by its
// hash, so a long header cannot bypass its limit. Only a call the
// original refuses as a whole (no domain, no descriptors), one over the
// agent's batch cap, or one with a limit override the agent cannot
// enforce (admission refuses the batch: policy.ErrInvalidOwnLimit) fails,
// before anything is charged.
//
// A descriptor's limit override (RateLimitOverride), in a configured
// domain, is the request's own limit (admission.Request.Limit), under the
// policy the descriptor matched: admission decides it in region scope, in
// that policy's counter where the window is the same, as the original
// counts it.
type envoyServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	api *Server
}

// The errors envoyproxy/ratelimit refuses a call with
// (src/service/ratelimit.go, shouldRateLimitWorker): plain Go errors its
// handler returns, so gRPC's UNKNOWN with these messages. The agent
// refuses the same calls with the same status, so a client (or a test)
// that reads either sees the same answer.
var (
	errEnvoyNoDomain      = status.Error(codes.Unknown, "rate limit domain must not be empty")
	errEnvoyNoDescriptors = status.Error(codes.Unknown, "rate limit descriptor list must not be empty")
)

// EnvoyValue is an attribute value as the agent counts it: long values by
// their hash (distinct values stay distinct buckets).
func EnvoyValue(v string) string {
	if len(v) <= policy.MaxAttributeValueBytes {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (s *envoyServer) ShouldRateLimit(
	ctx context.Context,
	req *rlsv3.RateLimitRequest,
) (*rlsv3.RateLimitResponse, error) {
	// Refused as a whole, in the original's order; nothing is charged.
	switch {
	case req.Domain == "":
		return nil, errEnvoyNoDomain
	case len(req.Descriptors) == 0:
		return nil, errEnvoyNoDescriptors
	case len(req.Descriptors) > MaxBatch:
		// The agent's cap (the original has none but gRPC's message size).
		return nil, status.Errorf(codes.InvalidArgument,
			"a request holds 1-%d descriptors, got %d", MaxBatch, len(req.Descriptors))
	}
	ins, matched, err := envoyRequests(s.api.c.Envoy(), req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	res := s.api.c.Checker.CheckBatch(ctx, ins)
	for _, r := range res {
		// A limit override admission cannot enforce, or a return to a
		// limit that takes none, refuses the call whole; nothing was
		// charged.
		if errors.Is(r.Err, policy.ErrInvalidOwnLimit) || errors.Is(r.Err, admission.ErrReturnRefused) {
			return nil, status.Error(codes.InvalidArgument, r.Err.Error())
		}
	}
	return envoyAnswer(&s.api.c.Answers, req, res, matched), nil
}

// envoyRequests decodes req's descriptors into one admission request each
// (a request naming no policy where no limit applies), and what the
// configuration says of each (envoyMatched).
func envoyRequests(ix EnvoyIndex, req *rlsv3.RateLimitRequest) ([]admission.Request, []envoyMatched, error) {
	ins := make([]admission.Request, len(req.Descriptors))
	found := make([]envoyMatched, len(req.Descriptors))
	matched := make([]*policy.Policy, len(req.Descriptors))
	var replaced map[string]bool // made only when a matched limit replaces another
	for i, d := range req.Descriptors {
		in := admission.Request{
			Attributes: map[string]string{},
			Cost:       int64(min(req.HitsAddend, math.MaxInt32)),
			Return:     d.GetIsNegativeHits(),
		}
		if h := d.GetHitsAddend(); h != nil {
			// Set to 0: a pure check, as the original answers it (the
			// request's 0 means 1, as there).
			in.Cost = int64(min(h.GetValue(), math.MaxInt32))
			in.Check = in.Cost == 0 && !in.Return
		}
		found[i].ret = in.Return
		p, configured := ix.Match(req.Domain, d.Entries)
		for _, e := range d.Entries {
			if !configured && (e.Key == "policy" || e.Key == "generic_key") {
				in.Policy = e.Value
				continue
			}
			in.Attributes[policy.EnvoyAttribute(e.Key)] = EnvoyValue(e.Value)
		}
		if configured && d.Limit != nil {
			// The descriptor's own limit, in place of whatever the
			// configuration says of it (unlimited, replaces, quota_mode,
			// shadow_mode), as in the original; it needs a matched limit
			// to count under (an unmatched descriptor gets no limit).
			own, err := envoyOwnLimit(d.Limit)
			if err != nil {
				return nil, nil, fmt.Errorf("descriptor %d: %w", i, err)
			}
			in.Policy = ""
			if p != nil {
				in.Policy, in.Limit = p.Name, own
			}
			ins[i] = in
			continue
		}
		if configured {
			in.Policy = "" // unmatched unless the configuration has it
			if p != nil {
				// An unlimited limit replaces others too, as in the original.
				for _, r := range p.Envoy.Replaces {
					if replaced == nil {
						replaced = map[string]bool{}
					}
					replaced[r] = true
				}
				if p.Envoy.Unlimited {
					found[i].unlimited = true
				} else {
					in.Policy, matched[i] = p.Name, p
				}
			}
		}
		ins[i] = in
	}
	for i, p := range matched {
		// Only a configured name can be replaced (the original's rule).
		if p == nil {
			continue
		}
		if n := p.EnvoyLimitName(); n != "" && replaced[n] {
			ins[i].Policy = "" // another matched limit replaces it
			continue
		}
		found[i].quota = p.Envoy.QuotaMode
	}
	return ins, found, nil
}

// envoyOwnLimit translates a descriptor's limit override into the
// request's own limit: requests_per_unit per unit (unit_multiplier is not
// read, as the original reads none). A unit that is no Envoy unit cannot
// be translated; admission decides whether the limit can be enforced.
func envoyOwnLimit(l *commonrl.RateLimitDescriptor_RateLimitOverride) (*policy.OwnLimit, error) {
	// The override's unit numbers are the response's (the original
	// converts one into the other by number).
	u := rlsv3.RateLimitResponse_RateLimit_Unit(l.Unit)
	for _, eu := range envoyUnits {
		if eu.u == u {
			return &policy.OwnLimit{Limit: int64(l.RequestsPerUnit), Period: policy.Duration(eu.d)}, nil
		}
	}
	return nil, fmt.Errorf("limit override unit %s: use SECOND, MINUTE, HOUR or DAY", u)
}
