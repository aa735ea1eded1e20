package checkapi

import (
	"fmt"
	"strings"
	"testing"

	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/testenv"
)

// current_limit in Envoy's units: the period's own unit, else the shortest
// in which the limit is whole (5 per 10 s reads 30 per minute; it read 0
// per second), else the shortest in which it is at least one.
func TestEnvoyLimitUnits(t *testing.T) {
	for _, c := range []struct {
		limit  float64
		period time.Duration
		want   uint32
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{5, 10 * time.Second, 30, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{100, time.Minute, 100, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{100, 90 * time.Second, 4000, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{7, 7 * time.Second, 1, rlsv3.RateLimitResponse_RateLimit_SECOND},
		{1, 3 * 24 * time.Hour, 10, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{1, 4 * 24 * time.Hour, 1, rlsv3.RateLimitResponse_RateLimit_WEEK}, // 1.75, rounded down
		{10, 45 * time.Second, 800, rlsv3.RateLimitResponse_RateLimit_HOUR},
	} {
		p := testenv.MustPolicy(t, fmt.Sprintf("name: p\nidentity: [a]\nlimit: %v\nperiod: %s\n", c.limit, c.period))
		got := envoyLimit(&Answers{}, admission.Outcome{Policy: p, Limits: p.Limits()})
		if got.RequestsPerUnit != c.want || got.Unit != c.unit {
			t.Errorf("%v per %v: %d per %s, want %d per %s", c.limit, c.period, got.RequestsPerUnit, got.Unit, c.want, c.unit)
		}
	}
}

// dynamic_metadata writes a descriptor's limit override as the proto's
// text, as the original does (descriptorToStruct), and nothing for a nil
// descriptor; without quota-mode limits, quotaModeEnabled is false.
func TestEnvoyMetadataLimitOverride(t *testing.T) {
	req := &rlsv3.RateLimitRequest{Domain: "m", Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}, nil}}
	req.Descriptors[0].Limit = &commonrl.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	md := envoyMetadata(req, nil, make([]envoyMatched, 2))
	ds := md.Fields["descriptors"].GetListValue().GetValues()
	if len(ds) != 1 {
		t.Fatalf("descriptors %v, want the one that is not nil", ds)
	}
	// Its spacing varies by build (protobuf's deliberate instability).
	limit := strings.ReplaceAll(ds[0].GetStructValue().Fields["limit"].GetStringValue(), " ", "")
	if !strings.Contains(limit, "requests_per_unit:7") || !strings.Contains(limit, "unit:MINUTE") {
		t.Fatalf("limit %q, want the override's text", limit)
	}
	if md.Fields["quotaModeEnabled"].AsInterface() != false || md.Fields["quotaModeViolations"] != nil || md.Fields["hitsAddend"] != nil {
		t.Fatalf("metadata %v", md)
	}
}
