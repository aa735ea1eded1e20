package regional

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipeliner sends the decisions of concurrent Check calls to Redis in
// shared pipelines: a sender takes the first call queued, adds every other
// call already queued (it never waits for more, so an idle engine adds no
// latency), and sends them as one pipeline; calls that queue meanwhile go
// out with the next. Each decision is still its own atomic script run, in
// queue order, so nothing about a decision changes but the round trips.
//
// A call whose context ends before its pipeline is sent is not sent (it is
// charged nothing); one whose context ends while its pipeline is in flight
// returns at once with the context's error, and its script may still run,
// as with a direct call that times out.
type pipeliner struct {
	rdb    Client
	queue  chan *queuedCall
	closed chan struct{}
	wg     sync.WaitGroup

	// mu orders queueing against close: a call queued before close is
	// sent (the senders drain the queue), none is queued after.
	mu       sync.RWMutex
	isClosed bool
}

// queuedCall is one Check waiting for its pipeline.
type queuedCall struct {
	ctx  context.Context
	c    call
	done chan callResult // buffered: the sender never blocks on it
}

type callResult struct {
	cmd *redis.Cmd
}

// Limits of a pipeline.
const (
	maxPipelineCalls = 256
	pipelineQueue    = 4096
	// pipelineTimeout bounds a pipeline of calls without deadlines.
	pipelineTimeout = time.Second
)

func newPipeliner(rdb Client, senders int) *pipeliner {
	p := &pipeliner{rdb: rdb, queue: make(chan *queuedCall, pipelineQueue), closed: make(chan struct{})}
	p.wg.Add(senders)
	for i := 0; i < senders; i++ {
		go p.run()
	}
	return p
}

// close stops the senders once the calls already queued are sent.
func (p *pipeliner) close() {
	p.mu.Lock()
	if !p.isClosed {
		p.isClosed = true
		close(p.closed)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// do queues c and waits for its reply, or for ctx. ok is false when the
// pipeliner is closed: the caller runs c itself.
func (p *pipeliner) do(ctx context.Context, c call) (cmd *redis.Cmd, ok bool, err error) {
	q := queuedCalls.Get().(*queuedCall)
	q.ctx, q.c = ctx, c
	p.mu.RLock()
	if p.isClosed {
		p.mu.RUnlock()
		q.recycle()
		return nil, false, nil
	}
	select {
	case p.queue <- q:
		p.mu.RUnlock()
	case <-ctx.Done():
		p.mu.RUnlock()
		q.recycle()
		return nil, true, ctx.Err()
	}
	select {
	case r := <-q.done:
		q.recycle()
		return r.cmd, true, nil
	case <-ctx.Done():
		// The sender may still answer on q.done: q is not reused.
		return nil, true, ctx.Err()
	}
}

// queuedCalls are reused once their reply is read (queuedCall.recycle).
var queuedCalls = sync.Pool{New: func() any { return &queuedCall{done: make(chan callResult, 1)} }}

// recycle returns q, whose done channel is empty, for reuse.
func (q *queuedCall) recycle() {
	q.ctx, q.c = nil, call{}
	queuedCalls.Put(q)
}

func (p *pipeliner) run() {
	defer p.wg.Done()
	batch := make([]*queuedCall, 0, maxPipelineCalls)
	for {
		var first *queuedCall
		select {
		case first = <-p.queue:
		case <-p.closed:
			p.drain()
			return
		}
		batch = append(batch[:0], first)
	more:
		for len(batch) < maxPipelineCalls {
			select {
			case q := <-p.queue:
				batch = append(batch, q)
			default:
				break more
			}
		}
		p.send(batch)
	}
}

// drain sends what is still queued at close, so no caller is left
// waiting longer than its own context.
func (p *pipeliner) drain() {
	for {
		select {
		case q := <-p.queue:
			p.send([]*queuedCall{q})
		default:
			return
		}
	}
}

// send runs batch as one pipeline (and, for scripts Redis did not know,
// one more with their source) and hands every call its reply.
func (p *pipeliner) send(batch []*queuedCall) {
	live := batch[:0]
	deadline := time.Time{}
	for _, q := range batch {
		if q.ctx.Err() != nil {
			continue // given up before it was sent: charged nothing
		}
		d, ok := q.ctx.Deadline()
		if !ok {
			d = time.Now().Add(pipelineTimeout)
		}
		if d.After(deadline) {
			deadline = d
		}
		live = append(live, q)
	}
	if len(live) == 0 {
		return
	}
	var ctx context.Context
	if _, ok := live[0].ctx.Deadline(); ok && len(live) == 1 {
		// One caller: its own context is the pipeline's.
		ctx = live[0].ctx
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
		defer cancel()
	}
	calls := make([]call, len(live))
	for i, q := range live {
		calls[i] = q.c
	}
	for i, cmd := range runPipelined(ctx, p.rdb, calls) {
		live[i].done <- callResult{cmd: cmd}
	}
}

// runPipelined runs calls as one pipeline with EVALSHA (a single call as a
// plain EVALSHA); the scripts Redis did not know yet are sent again with
// their source, which also loads them.
func runPipelined(ctx context.Context, rdb Client, calls []call) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	if len(calls) == 1 { // no pipeline to build for one call
		cmds[0] = calls[0].script.Run(ctx, rdb, calls[0].keys, calls[0].args...)
		return cmds
	}
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var retry []int
	for i, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		pipe := rdb.Pipeline()
		for _, i := range retry {
			cmds[i] = calls[i].script.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
		}
		_, _ = pipe.Exec(ctx)
	}
	return cmds
}
