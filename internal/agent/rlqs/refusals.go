package rlqs

import (
	"errors"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// Refusals of a bucket the agent would serve otherwise: a policy without
// edge settings, a second bucket id for an identity one stream already
// reports, and instances beyond the policy's per region (edge/places.go:
// refused as the region's Redis answers, the bucket kept to ask again).
var (
	errNoEdge       = errors.New("the policy has no edge settings: it is not served to Envoy's RLQS")
	errSecondBucket = errors.New("the stream already reports a bucket of this identity under another bucket " +
		"id: one Envoy instance gets one bucket per identity")
	errInstances = errors.New("the policy's edge instances per region already hold this identity's " +
		"places: this one gets no assignment, and keeps the policy's no_assignment behaviour, until a place " +
		"frees")
)

// refusedReason is the metric reason of a refused bucket.
func refusedReason(err error) string {
	switch {
	case errors.Is(err, errNoEdge):
		return "no-edge"
	case errors.Is(err, errSecondBucket):
		return "second-bucket"
	case errors.Is(err, errInstances):
		return "instances"
	case errors.Is(err, admission.ErrUnknownPolicy):
		return "unknown-policy"
	case errors.Is(err, policy.ErrInvalidIdentity):
		return "identity"
	default:
		return "invalid"
	}
}
