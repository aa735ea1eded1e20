package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/agent/checkapi"
	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// 300 checks of 4 MB each, 30 at a time, are refused for their size
// before the agent buffers them (the default limit would have let each
// through and taken the agent past a gigabyte), and a normal check is
// answered meanwhile.
func TestOversizedChecksRefused(t *testing.T) {
	ra := regionAgent(t, apiPolicy+"scope: region\n", nil)
	cl := pb.NewCheckServiceClient(grpcConn(t, ra.grpcAddr))
	ctx := t.Context()
	big := strings.Repeat("x", 4<<20-1024) // just under gRPC's default limit
	var wg sync.WaitGroup
	var mu sync.Mutex
	codesSeen := map[codes.Code]int{}
	for wave := 0; wave < 10; wave++ {
		for range 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_, err := cl.Check(cctx, &pb.CheckRequest{Policy: "api", Attributes: map[string]string{"tenant": big}})
				mu.Lock()
				codesSeen[status.Code(err)]++
				mu.Unlock()
			}()
		}
		// Answered (the client's own 30 marshalling goroutines may slow
		// Redis past the check timeout, so the fallback may decide it).
		if _, err := cl.Check(ctx, &pb.CheckRequest{Policy: "api", Attributes: tenantA}); err != nil {
			t.Fatalf("a normal check during the oversized ones: %v", err)
		}
		wg.Wait()
	}
	if codesSeen[codes.ResourceExhausted] != 300 {
		t.Fatalf("oversized checks answered %v, want 300 ResourceExhausted", codesSeen)
	}
}

// 200 connections that send a request's headers and then stall its body
// (three times the test agent's connection cap) are cut after the read
// timeout; gRPC checks are answered throughout, and an HTTP check is
// answered once the stalled connections are gone.
func TestSlowBodiesDoNotStarveOthers(t *testing.T) {
	testenv.SkipSlow(t, "waits out the HTTP read timeout with 200 stalled connections, about 16 s")
	ra := regionAgent(t, apiPolicy+"scope: region\n", nil)
	host := strings.TrimPrefix(ra.httpURL, "http://")
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := 0; i < 3*httpConns+8; i++ {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
		slow = append(slow, c)
	}
	cl := pb.NewCheckServiceClient(grpcConn(t, ra.grpcAddr))
	answer, err := cl.Check(t.Context(), &pb.CheckRequest{Policy: "api", Attributes: tenantA})
	if err != nil || !answer.Allowed {
		t.Fatalf("gRPC check during the slow bodies: %+v %v", answer, err)
	}
	hc := &http.Client{Timeout: 4 * checkapi.HTTPReadTimeout}
	resp, err := hc.Post(ra.httpURL+"/v1/check", "application/json", strings.NewReader(`{"policy":"api","attributes":{"tenant":"b"}}`))
	if err != nil {
		t.Fatalf("HTTP check after the slow bodies: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP check: %d", resp.StatusCode)
	}
	// The first stalled connections were accepted and then cut: closed
	// (EOF) or reset (the agent closed with the stalled body unread); only
	// our own deadline passing means it was left open.
	slow[0].SetReadDeadline(time.Now().Add(4 * checkapi.HTTPReadTimeout))
	if _, err := io.ReadAll(slow[0]); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stalled connection was not closed by the agent: %v", err)
	}
}
