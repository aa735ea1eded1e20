package leaseapi

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrInstanceHeld reports a Lease call refused because another live agent
// process (another nonce) holds the instance name it gave: that process
// keeps the name until its grants end, so a stray or forged call cannot
// evict it. The caller retries after the delay the refusal carries
// (InstanceHeld).
var ErrInstanceHeld = errors.New("instance name held by another live agent process")

// InstanceHeldError is the coordinator's refusal of a Lease call naming
// region's instance while another process holds it for heldFor more: code
// AlreadyExists, a message saying what to do, and the delay as a
// google.rpc.RetryInfo detail.
func InstanceHeldError(region, instance string, heldFor time.Duration) error {
	st := status.New(codes.AlreadyExists, fmt.Sprintf("%v: instance %q of region %q is held by another agent "+
		"process until its grants end, in %v. "+
		"A restarted agent takes it over sooner, once the previous process's heartbeat in the region's Redis "+
		"has stopped; if two running agents share --instance, give each its own (issue per-instance "+
		"certificates: coordinator certs issue --region %s --instance NAME)",
		ErrInstanceHeld, instance, region, heldFor.Round(time.Millisecond), region))
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(heldFor)}); err == nil {
		st = d
	}
	return st.Err()
}

// InstanceHeld reports whether err is a coordinator's ErrInstanceHeld
// refusal (InstanceHeldError), possibly wrapped, and how long to wait
// before asking again: the refusal's retry delay, or fallback when it
// carries none.
func InstanceHeld(err error, fallback time.Duration) (retryAfter time.Duration, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.AlreadyExists {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, isRetry := d.(*errdetails.RetryInfo); isRetry && ri.GetRetryDelay().AsDuration() > 0 {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return fallback, true
}
