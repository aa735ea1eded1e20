package agent

import (
	"net/http"
	"strings"
	"testing"

	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// A token budget reserved and settled over both APIs, against a real
// Redis: HTTP reserves an estimate and names the reservation, the
// settlement gives back what the estimate was over; gRPC's settlement of
// an estimate that was under charges the excess, counted though it no
// longer fits, so the next check is refused. A reservation of a policy
// without post_hoc is bad input.
func TestReservationsOverHTTPAndGRPC(t *testing.T) {
	ra := regionAgent(t, `name: llm
identity: [user]
algorithm: fixed_window
limit: 1000
period: 1h
post_hoc: true
scope: region
---
name: plain
identity: [user]
limit: 10
period: 1s
scope: region
`, nil)
	status, _, body := postCheck(t, ra.httpURL, `{"policy":"llm","attributes":{"user":"u1"},"cost":600,"reserve":true}`)
	name, _ := body["reservation"].(string)
	if status != http.StatusOK || !strings.HasPrefix(name, "600.") || body["remaining"] != float64(400) {
		t.Fatalf("a reservation of 600: %d %v, want 200 naming 600.<key> with 400 left", status, body)
	}
	if status, _, body := postCheck(t, ra.httpURL, `{"policy":"llm","attributes":{"user":"u1"},"cost":500,"reserve":true}`); status != http.StatusTooManyRequests {
		t.Fatalf("a second reservation of 500 with 400 left: %d %v, want 429", status, body)
	}
	status, _, body = postCheck(t, ra.httpURL, `{"policy":"llm","attributes":{"user":"u1"},"cost":450,"settle":"`+name+`"}`)
	if status != http.StatusOK || body["remaining"] != float64(550) {
		t.Fatalf("settled at 450: %d %v, want 550 left (150 given back)", status, body)
	}

	c := pb.NewCheckServiceClient(grpcConn(t, ra.grpcAddr))
	user := map[string]string{"user": "u1"}
	r, err := c.Check(t.Context(), &pb.CheckRequest{Policy: "llm", Attributes: user, Cost: 500, Reserve: true, IdempotencyKey: "turn-2"})
	if err != nil || !r.Allowed || r.Reservation != "500.turn-2" || r.Remaining != 50 {
		t.Fatalf("a reservation of 500 over gRPC: %v %v, want admitted as 500.turn-2 with 50 left", r, err)
	}
	r, err = c.Check(t.Context(), &pb.CheckRequest{Policy: "llm", Attributes: user, Cost: 900, Settle: r.Reservation})
	if err != nil || r.Allowed || r.Remaining != 0 {
		t.Fatalf("settled at 900 of 500 over gRPC: %v %v, want the excess counted and refused (over the limit)", r, err)
	}
	r, err = c.Check(t.Context(), &pb.CheckRequest{Policy: "llm", Attributes: user, Check: true})
	if err != nil || r.Allowed {
		t.Fatalf("a check over the limit: %v %v, want refused", r, err)
	}
	if status, _, body := postCheck(t, ra.httpURL, `{"policy":"plain","attributes":{"user":"u1"},"reserve":true}`); status != http.StatusBadRequest || !strings.Contains(body["detail"].(string), "post_hoc") {
		t.Fatalf("a reservation of a plain policy: %d %v, want 400 naming post_hoc", status, body)
	}
}
