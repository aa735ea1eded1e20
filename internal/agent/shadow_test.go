package agent

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quota-lease/quota-lease/admission"
)

// A policy in shadow mode never rejects: over its limit a check is
// allowed, marked shadow in every API's answer, counted as
// result="shadow", and charges nothing more.
func TestShadowModeNeverRejects(t *testing.T) {
	ra := regionAgent(t, "name: trial\nidentity: [user]\nalgorithm: fixed_window\nlimit: 2\nperiod: 1m\nscope: region\nshadow_mode: true\n", nil)
	roomInWindow(t, time.Minute)
	for i := 0; i < 5; i++ {
		o, err := ra.a.Check(t.Context(), admission.Request{Policy: "trial", Attributes: map[string]string{"user": "u"}})
		if err != nil || !o.Allowed || o.Shadow != (i >= 2) {
			t.Fatalf("check %d: %+v %v, want allowed, shadow from the third", i, o, err)
		}
	}
	resp, err := http.Post(ra.httpURL+"/v1/check", "application/json", strings.NewReader(`{"policy":"trial","attributes":{"user":"u"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 200 || body["shadow"] != true {
		t.Fatalf("HTTP over the limit in shadow mode: %d %v, want 200 with shadow", resp.StatusCode, body)
	}
	client := rlsv3.NewRateLimitServiceClient(grpcConn(t, ra.grpcAddr))
	er, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{entries("generic_key", "trial", "user", "u")}})
	if err != nil || er.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("Envoy over the limit in shadow mode: %v %v, want OK", er, err)
	}
	if n := counterValueLabeled(t, ra.a, "quotalease_agent_decisions_total", "result", "shadow"); n != 5 {
		t.Fatalf("%v shadow decisions counted, want 5", n)
	}
}

// The agent-wide switch puts every policy in shadow mode.
func TestShadowModeSwitch(t *testing.T) {
	ra := regionAgent(t, "name: strict\nidentity: [user]\nalgorithm: fixed_window\nlimit: 1\nperiod: 1m\nscope: region\n", func(c *Config) { c.Shadow = true })
	for i := 0; i < 3; i++ {
		if o, err := ra.a.Check(t.Context(), admission.Request{Policy: "strict", Attributes: map[string]string{"user": "u"}}); err != nil || !o.Allowed {
			t.Fatalf("check %d with the shadow switch on: %+v %v", i, o, err)
		}
	}
}
