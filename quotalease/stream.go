package quotalease

import (
	"context"
	"sync/atomic"
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
	// answered is set by the stream's receiver at its first answer;
	// unanswered are the reports written before it, written again on the
	// next stream if the agent ends this one without answering (refused
	// it): so a new bucket's first report is not lost to a refusal.
	answered   *atomic.Bool
	unanswered []*rlqsv3.RateLimitQuotaUsageReports
	// agent is the index of the agent streams open to; wait is the next
	// reconnection's delay, and retry its timer (nil when none is due).
	agent int
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
				c.lost(&cn, cn.answered.Load())
			}
		}
	}
}

// lost forgets the stream and, unless reconnecting with the next report,
// schedules a reconnection. A stream the agent answered on is opened again
// after the first wait, to the same agent; one it never answered (refused,
// or never opened) moves to the next agent, after a wait doubling up to
// the report interval, so that refusals are not retried in a storm.
func (c *Client) lost(cn *conn, answered bool) {
	cn.cancel()
	cn.phase, cn.stream = down, nil
	if answered {
		cn.wait = c.cfg.Reconnect
	} else {
		cn.agent = (cn.agent + 1) % len(c.agents)
		cn.pending = append(cn.unanswered, cn.pending...)
	}
	cn.unanswered = nil
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
	gen, agent := cn.gen, c.agents[cn.agent].rlqs
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		s, err := agent.StreamRateLimitQuotas(ctx)
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
		c.count(func(st *Stats) { st.StreamFailures++ })
		if c.cfg.ReconnectWithReport { // Envoy drops what waited for the stream
			c.count(func(st *Stats) { st.Dropped += uint64(len(cn.pending)) })
			cn.pending = nil
		}
		c.lost(cn, false)
		return
	}
	c.count(func(st *Stats) { st.StreamStarts++ })
	cn.phase, cn.stream, cn.answered = up, s.stream, &atomic.Bool{}
	c.wg.Add(1)
	go c.receive(s.stream, s.gen, cn.answered, closeCh)
	pending := cn.pending
	cn.pending = nil
	for _, msg := range pending {
		c.send(cn, msg)
	}
}

// receive applies each response until the stream ends, then tells the
// main loop which stream ended; answered is set at the first response.
func (c *Client) receive(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, gen int, answered *atomic.Bool,
	closeCh chan<- int) {
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
		answered.Store(true)
		c.apply(resp)
	}
}

// send writes msg on the stream, or queues it while the stream opens or
// until a retry opens one (with ReconnectWithReport, as Envoy, a report
// while there is no stream is dropped).
func (c *Client) send(cn *conn, msg *rlqsv3.RateLimitQuotaUsageReports) {
	switch cn.phase {
	case up:
		kept := !cn.answered.Load() && !c.cfg.ReconnectWithReport && len(cn.unanswered) < c.cfg.SendQueue
		if kept {
			cn.unanswered = append(cn.unanswered, msg)
		}
		if err := cn.stream.Send(msg); err != nil { // the stream ended; Recv reports it
			if !kept {
				c.count(func(s *Stats) { s.Dropped++ })
			}
			return
		}
		c.count(func(s *Stats) { s.Sent++ })
	case starting:
		c.queue(cn, msg)
	default: // down: kept for the stream the retry opens; Envoy drops it
		if c.cfg.ReconnectWithReport {
			c.count(func(s *Stats) { s.Dropped++ })
			return
		}
		c.queue(cn, msg)
	}
}

// queue keeps msg for the stream being opened, up to SendQueue; beyond,
// it is dropped.
func (c *Client) queue(cn *conn, msg *rlqsv3.RateLimitQuotaUsageReports) {
	if len(cn.pending) < c.cfg.SendQueue {
		cn.pending = append(cn.pending, msg)
		return
	}
	c.count(func(s *Stats) { s.Dropped++ })
}
