package quotalease

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/metadata"
)

type phase int

const (
	down     phase = iota // no stream
	starting              // opening; reports wait
	up
)

// conn is the stream's state, owned by the main loop.
type conn struct {
	phase   phase
	gen     int // which stream the started and closed events are about
	stream  rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel  context.CancelFunc
	pending []*rlqsv3.RateLimitQuotaUsageReports
	// wait is the next reconnection's delay, and retry its timer (nil
	// when none is due).
	wait  time.Duration
	retry *time.Timer
}

type started struct {
	gen    int
	stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	err    error
}

// run is the client's main loop, as Envoy's main thread runs its RLQS
// client: it starts the report timer and the stream with the first
// bucket, writes every report, reopens a stream that ended (after a
// backoff, or with the next report as Envoy does) and forgets a stream
// the agent closed. Buckets and their assignments are untouched by any of
// it: they live until their deadlines whether the stream is up or not.
func (c *Client) run() {
	defer c.wg.Done()
	var (
		cn      = conn{wait: c.cfg.Reconnect}
		ticker  *time.Ticker
		tick    <-chan time.Time
		retry   <-chan time.Time
		startCh = make(chan started)
		closeCh = make(chan int)
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
		if cn.retry != nil {
			cn.retry.Stop()
		}
		if cn.cancel != nil {
			cn.cancel()
		}
	}()
	for {
		if cn.retry != nil {
			retry = cn.retry.C
		} else {
			retry = nil
		}
		select {
		case <-c.ctx.Done():
			return
		case msg := <-c.outbox:
			if ticker == nil { // the first bucket ever
				ticker = time.NewTicker(c.cfg.ReportInterval)
				tick = ticker.C
				c.start(&cn, startCh)
			}
			c.send(&cn, msg)
		case <-tick:
			c.onTick(&cn, startCh)
		case <-c.tickNow:
			if ticker != nil {
				c.onTick(&cn, startCh)
			}
		case <-retry:
			cn.retry = nil
			if cn.phase == down {
				c.start(&cn, startCh)
			}
		case <-c.reset:
			if cn.phase != down {
				cn.cancel() // the start fails, or Recv ends: handled below
			}
		case s := <-startCh:
			c.onStarted(&cn, s, closeCh)
		case gen := <-closeCh:
			if gen == cn.gen && cn.phase == up {
				c.count(func(s *Stats) { s.StreamsClosed++ })
				c.lost(&cn)
			}
		}
	}
}

// lost forgets the stream and, unless reconnecting with the next report,
// schedules a reconnection after the current wait, doubling it up to the
// report interval.
func (c *Client) lost(cn *conn) {
	cn.cancel()
	cn.phase, cn.stream = down, nil
	if c.cfg.ReconnectWithReport || cn.retry != nil {
		return
	}
	cn.retry = time.NewTimer(cn.wait)
	cn.wait = min(2*cn.wait, c.cfg.ReportInterval)
}

// onTick builds the report of every bucket, reopening the stream first
// if it is down. The counts are reset whether or not the report is then
// written, as in Envoy.
func (c *Client) onTick(cn *conn, startCh chan<- started) {
	msg := c.periodicReport()
	if cn.phase == down {
		c.start(cn, startCh)
	}
	c.send(cn, msg)
}

// start opens a stream without blocking the main loop.
func (c *Client) start(cn *conn, startCh chan<- started) {
	if cn.retry != nil {
		cn.retry.Stop()
		cn.retry = nil
	}
	cn.gen++
	ctx, cancel := context.WithCancel(c.ctx)
	md := c.cfg.Metadata
	if !c.cfg.Anonymous {
		md = metadata.Join(md, metadata.Pairs(ClientMetadata, "go"))
	}
	if len(md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	cn.phase, cn.cancel = starting, cancel
	gen := cn.gen
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		s, err := c.client.StreamRateLimitQuotas(ctx)
		select {
		case startCh <- started{gen: gen, stream: s, err: err}:
		case <-c.ctx.Done():
		}
	}()
}

func (c *Client) onStarted(cn *conn, s started, closeCh chan<- int) {
	if s.gen != cn.gen || cn.phase != starting {
		return
	}
	if s.err != nil {
		c.count(func(st *Stats) { st.StreamFailures++; st.Dropped += uint64(len(cn.pending)) })
		cn.pending = nil
		c.lost(cn)
		return
	}
	c.count(func(st *Stats) { st.StreamStarts++ })
	cn.phase, cn.stream, cn.wait = up, s.stream, c.cfg.Reconnect
	c.wg.Add(1)
	go c.receive(s.stream, s.gen, closeCh)
	pending := cn.pending
	cn.pending = nil
	for _, msg := range pending {
		c.send(cn, msg)
	}
}

// receive applies each response until the stream ends, then tells the
// main loop which stream ended.
func (c *Client) receive(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, gen int, closeCh chan<- int) {
	defer c.wg.Done()
	for {
		resp, err := s.Recv()
		if err != nil {
			select {
			case closeCh <- gen:
			case <-c.ctx.Done():
			}
			return
		}
		c.apply(resp)
	}
}

// send writes msg on the stream, queues it while the stream opens, or
// drops it when there is none.
func (c *Client) send(cn *conn, msg *rlqsv3.RateLimitQuotaUsageReports) {
	switch cn.phase {
	case up:
		if err := cn.stream.Send(msg); err != nil { // the stream ended; Recv reports it
			c.count(func(s *Stats) { s.Dropped++ })
			return
		}
		c.count(func(s *Stats) { s.Sent++ })
	case starting:
		if len(cn.pending) < c.cfg.SendQueue {
			cn.pending = append(cn.pending, msg)
			return
		}
		c.count(func(s *Stats) { s.Dropped++ })
	default:
		c.count(func(s *Stats) { s.Dropped++ })
	}
}
