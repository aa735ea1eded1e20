package logs

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
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

// A flood of one kind of line is one line per interval, the next saying
// how many were left out; other kinds are logged meanwhile; the standard
// logger's lines are paced by their first words.
func TestPaced(t *testing.T) {
	var out bytes.Buffer
	l, err := New("agent", "info", false, &out)
	if err != nil {
		t.Fatal(err)
	}
	var mono time.Duration
	p := NewPaced(l, time.Second, func() time.Duration { return mono })
	std := p.StdLogger()
	for i := 0; i < 100; i++ {
		std.Printf("http: TLS handshake error from 127.0.0.%d:1234: EOF", i)
		p.Warn("other-kind", "something else")
		mono += time.Millisecond
	}
	mono += time.Second
	std.Printf("http: TLS handshake error from 127.0.0.1:1234: EOF")
	s := out.String()
	if n := strings.Count(s, "TLS handshake error"); n != 2 {
		t.Fatalf("%d handshake lines for 101 over 1.1 s, want 2:\n%s", n, s)
	}
	if strings.Count(s, "something else") != 1 || !strings.Contains(s, "suppressed=99") {
		t.Fatalf("want one line of the other kind and a count of the 99 left out:\n%s", s)
	}
	for i := 0; i < 2*maxPacedKinds; i++ { // kinds beyond the bound share one
		p.Warn(strings.Repeat("k", i+1), "kind")
	}
	if len(p.kinds) > maxPacedKinds+1 {
		t.Fatalf("%d kinds kept", len(p.kinds))
	}
}
