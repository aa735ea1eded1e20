package checkapi

import (
	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// envoyMetadata is the dynamic_metadata of an answer to req, as
// envoyproxy/ratelimit (the version pinned in the Makefile,
// src/service/ratelimit.go: ratelimitToMetadata and descriptorToStruct)
// writes it when RESPONSE_DYNAMIC_METADATA is on (the agent's
// Answers.EnvoyDynamicMetadata). Envoy stores it as the filter's dynamic
// metadata, where access logs and later filters read it:
//
//   - domain: the call's domain;
//   - descriptors: per descriptor, its entries as "key=value" strings,
//     its limit override as the proto's text ("limit", when set) and its
//     hitsAddend (when set, 0 included);
//   - hitsAddend: the call's, when not 0;
//   - quotaModeViolations: the indexes of the descriptors over a limit in
//     quota mode, when there are any;
//   - quotaModeEnabled: whether a limit applied to the call is configured
//     with quota_mode (the global quota mode does not count, as in the
//     original).
//
// Numbers are JSON numbers (float64), as structpb holds them.
func envoyMetadata(req *rlsv3.RateLimitRequest, quotaViolations []int, matched []envoyMatched) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.Domain)}
	descriptors := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d != nil {
			descriptors = append(descriptors, structpb.NewStructValue(envoyDescriptorMetadata(d)))
		}
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descriptors})
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if len(quotaViolations) > 0 {
		vs := make([]*structpb.Value, len(quotaViolations))
		for i, v := range quotaViolations {
			vs[i] = structpb.NewNumberValue(float64(v))
		}
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: vs})
	}
	enabled := false
	for _, m := range matched {
		enabled = enabled || m.quota
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(enabled)
	return &structpb.Struct{Fields: fields}
}

// envoyDescriptorMetadata is one descriptor's entry in envoyMetadata.
func envoyDescriptorMetadata(d *commonrl.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, len(d.Entries))
	for i, e := range d.Entries {
		entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if d.Limit != nil {
		// The proto's text form, as the original writes it (its spacing
		// is not stable across builds: read it as text, not as a key).
		fields["limit"] = structpb.NewStringValue(d.Limit.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}
