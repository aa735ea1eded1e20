package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/quota-lease/quota-lease/internal/testenv"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// rawCodec sends bytes already encoded, so that hundreds of concurrent
// 4 MB requests share one buffer in the test instead of one each.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return nil }
func (rawCodec) Name() string                       { return "proto" }

// procStatus reads one "Name: value kB" field of /proc/<pid>/status.
func procStatus(t *testing.T, pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func openFDs(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// The attacks on an agent's resources, against the real binary: 300
// concurrent checks of just under 4 MB each (gRPC's default limit; before,
// they took the agent from 45 MB to 1.3 GB) are refused for their size and
// the agent's peak memory stays small; 1,100 connections that stall
// before sending a request (before, they exhausted its descriptors) leave
// its descriptors bounded by the connection cap, and other clients are
// answered throughout.
func TestE2EAgentResourceLimits(t *testing.T) {
	testenv.SkipMultiProcess(t)
	c := start(t, globalPolicy)
	ctx := t.Context()
	a := c.Agents[0]
	pid := a.Pid()
	big, err := proto.Marshal(&pb.CheckRequest{Policy: "api-global", Attributes: map[string]string{"api": strings.Repeat("x", 4<<20-1024)}})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, a.Addr, c.pki.service, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[codes.Code]int{}
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			var reply []byte
			err := cc.Invoke(cctx, pb.CheckService_Check_FullMethodName, &big, &reply, grpc.ForceCodec(rawCodec{}))
			mu.Lock()
			got[status.Code(err)]++
			mu.Unlock()
		}()
	}
	if _, err := a.Check.Check(ctx, &pb.CheckRequest{Policy: "api-global", Attributes: map[string]string{"api": "a"}}); err != nil {
		t.Fatalf("a normal check during the oversized ones: %v", err)
	}
	wg.Wait()
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("300 oversized checks: %v; agent peak RSS %d MB", got, peak/1024)
	if got[codes.ResourceExhausted] != 300 {
		t.Fatalf("oversized checks answered %v, want 300 ResourceExhausted", got)
	}
	if peak > 300<<10 { // kB
		t.Fatalf("agent peak RSS %d MB under oversized checks", peak/1024)
	}

	host := strings.TrimPrefix(a.HTTP, "https://")
	var stalled []net.Conn
	defer func() {
		for _, s := range stalled {
			s.Close()
		}
	}()
	for i := 0; i < 1100; i++ {
		s, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		stalled = append(stalled, s)
	}
	time.Sleep(500 * time.Millisecond)
	fds := openFDs(t, pid)
	if _, err := a.Check.Check(ctx, &pb.CheckRequest{Policy: "api-global", Attributes: map[string]string{"api": "a"}}); err != nil {
		t.Fatalf("a gRPC check during 1,100 stalled connections: %v", err)
	}
	t.Logf("1,100 stalled HTTP connections: the agent holds %d descriptors", fds)
	if fds > 512+200 {
		t.Fatalf("agent holds %d descriptors: the connection cap did not hold", fds)
	}
	resp, err := c.web.Get(a.HTTP + "/healthz") // answered once the stalled ones time out
	if err != nil {
		t.Fatalf("HTTP after the stalled connections: %v", err)
	}
	resp.Body.Close()
}
