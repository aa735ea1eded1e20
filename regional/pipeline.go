package regional

import (
	"context"
	"sync"
	"time"
)

// pipeliner sends the decisions of concurrent Check calls to Redis
// together: a sender takes the first call queued, adds every other call
// already queued (it never waits for more, so an idle engine adds no
// latency), and decides them in one round trip (Engine.decide: one script
// run per maxScriptDecisions, per hash slot on a cluster, and the fixed
// windows' charges beside them); calls that queue
// meanwhile go out with the next. The decisions run in queue order, each as
// if alone, so nothing about a decision changes but the round trips and
// what Redis spends on them.
//
// A call whose context ends before its pipeline is sent is not sent (it is
// charged nothing); one whose context ends while its pipeline is in flight
// returns at once with the context's error, and its script may still run,
// as with a direct call that times out.
type pipeliner struct {
	decide func(context.Context, []decision) []decided
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
	d    decision
	done chan decided // buffered: the sender never blocks on it
}

// Limits of a pipeline.
const (
	maxPipelineCalls = 256
	pipelineQueue    = 4096
	// pipelineTimeout bounds a pipeline of calls without deadlines.
	pipelineTimeout = time.Second
)

// newPipeliner starts senders senders deciding with decide.
func newPipeliner(decide func(context.Context, []decision) []decided, senders int) *pipeliner {
	p := &pipeliner{decide: decide, queue: make(chan *queuedCall, pipelineQueue), closed: make(chan struct{})}
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

// do queues d and waits for its outcome, or for ctx. ok is false when the
// pipeliner is closed: the caller decides d itself.
func (p *pipeliner) do(ctx context.Context, d decision) (res decided, ok bool, err error) {
	q := queuedCalls.Get().(*queuedCall)
	q.ctx, q.d = ctx, d
	p.mu.RLock()
	if p.isClosed {
		p.mu.RUnlock()
		q.recycle()
		return decided{}, false, nil
	}
	select {
	case p.queue <- q:
		p.mu.RUnlock()
	case <-ctx.Done():
		p.mu.RUnlock()
		q.recycle()
		return decided{}, true, ctx.Err()
	}
	select {
	case r := <-q.done:
		q.recycle()
		return r, true, nil
	case <-ctx.Done():
		// The sender may still answer on q.done: q is not reused.
		return decided{}, true, ctx.Err()
	}
}

// queuedCalls are reused once their reply is read (queuedCall.recycle).
var queuedCalls = sync.Pool{New: func() any { return &queuedCall{done: make(chan decided, 1)} }}

// recycle returns q, whose done channel is empty, for reuse.
func (q *queuedCall) recycle() {
	q.ctx, q.d = nil, decision{}
	queuedCalls.Put(q)
}

func (p *pipeliner) run() {
	defer p.wg.Done()
	batch := make([]*queuedCall, 0, maxPipelineCalls)
	ds := make([]decision, 0, maxPipelineCalls) // reused by every send
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
		p.send(batch, ds)
	}
}

// drain sends what is still queued at close, so no caller is left
// waiting longer than its own context.
func (p *pipeliner) drain() {
	for {
		select {
		case q := <-p.queue:
			p.send([]*queuedCall{q}, nil)
		default:
			return
		}
	}
}

// send decides batch in one round trip (and, if Redis did not know the
// script, one more with its source) and hands every call its outcome. ds
// is room for the batch's decisions, reused.
func (p *pipeliner) send(batch []*queuedCall, ds []decision) {
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
	ds = ds[:0]
	for _, q := range live {
		ds = append(ds, q.d)
	}
	for i, res := range p.decide(ctx, ds) {
		live[i].done <- res
	}
	clear(ds) // holds no caller's keys until the next send
}
