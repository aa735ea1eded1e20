package agent

import (
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// readmeMessagingConfig is envoyproxy/ratelimit's README example of
// marketing messages and phone numbers, as the compatibility and parity
// tables load it.
const readmeMessagingConfig = `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: to_number
    value: "911"
    rate_limit: {unlimited: true}
`

// envoyStep is one ShouldRateLimit call and what envoyproxy/ratelimit
// answers for it: per descriptor, OK or OVER_LIMIT, and the limit it
// reports (0: none, the descriptor matched no limit).
type envoyStep struct {
	descriptors []*commonrl.RateLimitDescriptor
	codes       []rlsv3.RateLimitResponse_Code
	limits      []uint32
	times       int // repeat the call this often (default 1)
}

// The compatibility table: envoyproxy/ratelimit configurations from its
// README, loaded unchanged (plus scope: region, so that one agent holds
// the whole limit, as in the parity table), and request sequences
// answered as that service answers them, descriptor by descriptor, through
// a real gRPC client.
func TestEnvoyCompatibility(t *testing.T) {
	cases := []struct {
		name, config, domain string
		steps                []envoyStep
	}{
		{"database users", `domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
`, "mongo_cps", []envoyStep{
			{descriptors: d(entries("database", "users")), codes: c(ok), limits: l(2), times: 2},
			{descriptors: d(entries("database", "users")), codes: c(over), limits: l(2)},
			{descriptors: d(entries("database", "default")), codes: c(ok), limits: l(500)},
			{descriptors: d(entries("database", "other")), codes: c(ok), limits: l(0)}, // no such value: no limit
		}},
		{"messaging", readmeMessagingConfig, "messaging", []envoyStep{
			// A marketing message to a number counts against both limits.
			{descriptors: d(entries("message_type", "marketing", "to_number", "2061111111"), entries("to_number", "2061111111")),
				codes: c(ok, ok), limits: l(2, 3), times: 2},
			{descriptors: d(entries("message_type", "marketing", "to_number", "2061111111"), entries("to_number", "2061111111")),
				codes: c(over, ok), limits: l(2, 3)},
			{descriptors: d(entries("to_number", "2061111111")), codes: c(over), limits: l(3)},
			// Every number has its own limit; 911 has none.
			{descriptors: d(entries("to_number", "2062222222")), codes: c(ok), limits: l(3)},
			{descriptors: d(entries("to_number", "911")), codes: c(ok), limits: l(0), times: 5},
		}},
		{"to_number and from_number", `domain: sms
descriptors:
  - key: to_number
    value: "2061111111"
    descriptors:
      - key: from_number
        rate_limit: {unit: hour, requests_per_unit: 2}
`, "sms", []envoyStep{
			// Each sender to that number has its own limit.
			{descriptors: d(entries("to_number", "2061111111", "from_number", "a")), codes: c(ok), limits: l(2), times: 2},
			{descriptors: d(entries("to_number", "2061111111", "from_number", "a")), codes: c(over), limits: l(2)},
			{descriptors: d(entries("to_number", "2061111111", "from_number", "b")), codes: c(ok), limits: l(2)},
			// Another number, or the number alone, matches no limit.
			{descriptors: d(entries("to_number", "2062222222", "from_number", "a")), codes: c(ok), limits: l(0)},
			{descriptors: d(entries("to_number", "2061111111")), codes: c(ok), limits: l(0), times: 3},
		}},
		{"exact value before key-only, greedily", `domain: walk
descriptors:
  - key: database
    value: users
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: database
    descriptors:
      - key: collection
        rate_limit: {unit: minute, requests_per_unit: 1}
`, "walk", []envoyStep{
			{descriptors: d(entries("database", "orders", "collection", "c")), codes: c(ok), limits: l(1)},
			{descriptors: d(entries("database", "orders", "collection", "c")), codes: c(over), limits: l(1)},
			// database=users is taken first, and it has no collection child:
			// no limit, as envoyproxy/ratelimit walks.
			{descriptors: d(entries("database", "users", "collection", "c")), codes: c(ok), limits: l(0), times: 3},
		}},
		{"replaces", `domain: rp
descriptors:
  - key: key1
    rate_limit: {unit: minute, requests_per_unit: 1, name: key1-limit}
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 2
      replaces: [{name: key1-limit}]
`, "rp", []envoyStep{
			{descriptors: d(entries("key1", "a")), codes: c(ok), limits: l(1)},
			// key2's limit replaces key1's in a request that matches both.
			{descriptors: d(entries("key1", "a"), entries("key2", "b")), codes: c(ok, ok), limits: l(0, 2)},
			{descriptors: d(entries("key1", "a")), codes: c(over), limits: l(1)},
		}},
		{"domains are namespaces", `domain: one
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`, "two", []envoyStep{
			{descriptors: d(entries("user", "u")), codes: c(ok), limits: l(0), times: 3},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := envoyClient(t, tc.config+"scope: region\n", nil)
			roomInWindow(t, time.Second) // no case's window is shorter; its calls fall in one
			for si, st := range tc.steps {
				for n := 0; n < max(1, st.times); n++ {
					resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: tc.domain, Descriptors: st.descriptors})
					if err != nil {
						t.Fatalf("step %d: %v", si, err)
					}
					for i, s := range resp.Statuses {
						var lim uint32
						if s.CurrentLimit != nil {
							lim = s.CurrentLimit.RequestsPerUnit
						}
						if s.Code != st.codes[i] || lim != st.limits[i] {
							t.Fatalf("step %d call %d descriptor %d: %s limit %d, want %s limit %d", si, n, i, s.Code, lim, st.codes[i], st.limits[i])
						}
					}
				}
			}
		})
	}
}

func c(cs ...rlsv3.RateLimitResponse_Code) []rlsv3.RateLimitResponse_Code { return cs }
func l(ls ...uint32) []uint32                                             { return ls }
