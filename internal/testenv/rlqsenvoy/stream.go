package rlqsenvoy

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/metadata"
)

type phase int

const (
	down     phase = iota // no stream (stream_ == nullptr)
	starting              // opening; reports wait, as in Envoy's stream buffer
	up
)

// conn is the stream's state, owned by the main loop.
type conn struct {
	phase   phase
	gen     int // which stream the started and closed events are about
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel  context.CancelFunc
	pending []*rlqsv3.RateLimitQuotaUsageReports
}

type started struct {
	gen    int
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	err    error
}

// run is Envoy's main thread for this client: it starts the report timer
// and the stream with the first bucket (createBucketImpl), writes every
// report, reopens the stream on a report tick when it is down
// (onSendReportsTimer), and forgets a stream the server closed
// (onRemoteClose). Buckets and their assignments are untouched by any of
// it: they live until their deadlines whether the stream is up or not.
func (in *Instance) run() {
	defer in.wg.Done()
	var (
		c       conn
		ticker  *time.Ticker
		tick    <-chan time.Time
		startCh = make(chan started)
		closeCh = make(chan int)
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
		if c.cancel != nil {
			c.cancel()
		}
	}()
	for {
		select {
		case <-in.ctx.Done():
			return
		case msg := <-in.outbox:
			if ticker == nil { // the first bucket ever
				ticker = time.NewTicker(in.cfg.ReportInterval)
				tick = ticker.C
				in.start(&c, startCh)
			}
			in.send(&c, msg)
		case <-tick:
			in.onTick(&c, startCh)
		case <-in.tickNow:
			if ticker != nil {
				in.onTick(&c, startCh)
			}
		case <-in.reset:
			if c.phase != down {
				c.cancel() // the start fails, or Recv ends: reported below
			}
		case s := <-startCh:
			in.onStarted(&c, s, closeCh)
		case gen := <-closeCh:
			if gen == c.gen && c.phase == up {
				in.count(func(s *Stats) { s.StreamsClosed++ })
				c.cancel()
				c.phase, c.stream = down, nil
			}
		}
	}
}

// onTick builds the report of every bucket, reopening the stream first
// if it is down. The counts are reset whether or not the report is then
// written, as in Envoy.
func (in *Instance) onTick(c *conn, startCh chan<- started) {
	msg := in.periodicReport()
	if c.phase == down {
		in.start(c, startCh)
	}
	in.send(c, msg)
}

// start opens a stream without blocking the main loop.
func (in *Instance) start(c *conn, startCh chan<- started) {
	c.gen++
	ctx, cancel := context.WithCancel(in.ctx)
	if len(in.cfg.InitialMetadata) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, in.cfg.InitialMetadata)
	}
	c.phase, c.cancel = starting, cancel
	gen := c.gen
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		s, err := in.client.StreamRateLimitQuotas(ctx)
		select {
		case startCh <- started{gen: gen, stream: s, err: err}:
		case <-in.ctx.Done():
		}
	}()
}

func (in *Instance) onStarted(c *conn, s started, closeCh chan<- int) {
	if s.gen != c.gen || c.phase != starting {
		return
	}
	if s.err != nil {
		in.count(func(st *Stats) { st.StreamFailures++; st.Dropped += uint64(len(c.pending)) })
		c.cancel()
		c.phase, c.pending = down, nil
		return
	}
	in.count(func(st *Stats) { st.StreamStarts++ })
	c.phase, c.stream = up, s.stream
	in.wg.Add(1)
	go in.receive(s.stream, s.gen, closeCh)
	pending := c.pending
	c.pending = nil
	for _, msg := range pending {
		in.send(c, msg)
	}
}

// receive applies each response until the stream ends, then tells the
// main loop which stream ended.
func (in *Instance) receive(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, gen int, closeCh chan<- int) {
	defer in.wg.Done()
	for {
		resp, err := s.Recv()
		if err != nil {
			select {
			case closeCh <- gen:
			case <-in.ctx.Done():
			}
			return
		}
		in.apply(resp)
	}
}

// send writes msg on the stream, queues it while the stream opens, or
// drops it when there is none (sendUsageReportImpl).
func (in *Instance) send(c *conn, msg *rlqsv3.RateLimitQuotaUsageReports) {
	switch c.phase {
	case up:
		if err := c.stream.Send(msg); err != nil { // the stream ended; Recv reports it
			in.count(func(s *Stats) { s.Dropped++ })
			return
		}
		in.count(func(s *Stats) { s.Sent++ })
	case starting:
		if len(c.pending) < in.cfg.SendQueue {
			c.pending = append(c.pending, msg)
			return
		}
		in.count(func(s *Stats) { s.Dropped++ })
	default:
		in.count(func(s *Stats) { s.Dropped++ })
	}
}
