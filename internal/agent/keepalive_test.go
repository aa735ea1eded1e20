package agent

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// An Envoy configured as docs/rlqs.md says (connection_keepalive every
// 5 s) pings the connection of an RLQS stream the agent does not write to.
// The agent answers every ping and keeps the stream for 30 s; grpc-go's
// default enforcement (no ping more often than every 5 minutes) sent GOAWAY
// "too_many_pings" at the third ping. The client speaks HTTP/2 frames
// itself, since grpc-go's own client will not ping more often than every
// 10 s; it opens the stream as Envoy's gRPC client does (HEADERS for the
// method, no message), so the agent has nothing to answer.
func TestEnvoyKeepaliveKeepsStream(t *testing.T) {
	testenv.SkipSlow(t, "pings every 5 s for 30 s")
	t.Parallel()
	ra := regionAgent(t, edgeTestPolicy, nil)
	c, err := net.Dial("tcp", ra.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", ra.grpcAddr},
		{":path", "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}

	// One goroutine reads, this one writes: frames come over a channel.
	frames, readErr, done := make(chan http2.Frame), make(chan error, 1), make(chan struct{})
	defer close(done)
	put := func(f http2.Frame) {
		select {
		case frames <- f:
		case <-done:
		}
	}
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				readErr <- err
				return
			}
			// The framer reuses a frame's memory at the next read; keep
			// what the test looks at.
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				put(&http2.GoAwayFrame{ErrCode: f.ErrCode, LastStreamID: f.LastStreamID})
			case *http2.RSTStreamFrame:
				put(&http2.RSTStreamFrame{FrameHeader: f.FrameHeader, ErrCode: f.ErrCode})
			case *http2.SettingsFrame:
				if !f.IsAck() {
					put(&http2.SettingsFrame{})
				}
			case *http2.PingFrame:
				put(&http2.PingFrame{FrameHeader: f.FrameHeader, Data: f.Data})
			}
		}
	}()
	const interval, pings = 5 * time.Second, 6
	for i := 1; i <= pings; i++ {
		serveFrames(t, fr, frames, readErr, interval, fmt.Sprintf("before ping %d", i), nil)
		data := [8]byte{byte(i)}
		if err := fr.WritePing(false, data); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		// Its answer comes in the next wait (or the last one below).
	}
	// Every ping answered, the stream still open.
	last := func(f *http2.PingFrame) bool { return f.Data[0] == pings }
	if !serveFrames(t, fr, frames, readErr, interval, fmt.Sprintf("after %d pings", pings), last) {
		t.Fatalf("ping %d was not answered", pings)
	}
}

// serveFrames answers what the agent sends on fr for up to d, as an Envoy
// keeping a stream open does (its settings acknowledged, its pings
// answered), and fails t, saying when, if the agent sends GOAWAY or resets
// the stream or the connection ends. It hands each acknowledgement of a
// ping of ours to acked, if any, and returns true as soon as acked does;
// false once d has passed.
func serveFrames(t *testing.T, fr *http2.Framer, frames <-chan http2.Frame, readErr <-chan error, d time.Duration,
	when string, acked func(*http2.PingFrame) bool) bool {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case f := <-frames:
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				t.Fatalf("%s the agent sent GOAWAY %v", when, f.ErrCode)
			case *http2.RSTStreamFrame:
				t.Fatalf("%s the agent reset the stream: %v", when, f.ErrCode)
			case *http2.SettingsFrame:
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			case *http2.PingFrame:
				if !f.IsAck() { // the agent's own keepalive
					if err := fr.WritePing(true, f.Data); err != nil {
						t.Fatal(err)
					}
				} else if acked != nil && acked(f) {
					return true
				}
			}
		case err := <-readErr:
			t.Fatalf("%s the connection ended: %v", when, err)
		case <-timer.C:
			return false
		}
	}
}
