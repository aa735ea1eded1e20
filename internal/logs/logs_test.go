package logs

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestNewAndRouting(t *testing.T) {
	if _, err := New("x", "bogus", false, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "trace, debug, info, warn or error") {
		t.Fatalf("bogus level: %v", err)
	}
	var out bytes.Buffer
	l, err := New("agent", "info", true, &out)
	if err != nil {
		t.Fatal(err)
	}
	redisLogger{l.Named("redis")}.Printf(context.Background(), "pool: %s\n", "dial failed")
	g := grpcLogger{l.Named("grpc")}
	g.Infof("connecting") // debug: not shown at info
	g.Warningf("transport closing")
	s := out.String()
	if !strings.Contains(s, `"@message":"pool: dial failed"`) || !strings.Contains(s, `"@module":"agent.redis"`) ||
		!strings.Contains(s, "transport closing") || strings.Contains(s, "connecting") {
		t.Fatalf("routed log:\n%s", s)
	}
}
