package regional

import (
	"context"
	"fmt"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/policy"
)

// The tests check the engine as its callers do, a request at a time,
// through admission's validation (admission.Resolve) and Decide.

// Request is one check of Check and CheckBatch: the fields of an
// admission.Request, and limits to enforce instead of the policy's.
type Request struct {
	Policy     string
	Attributes map[string]string
	Cost       int64 // whole units, at least 1; 0 with Check
	// Check charges nothing (admission.Request.Check).
	Check          bool
	IdempotencyKey string
	// Return gives Cost back instead of charging it (admission.Request.Return).
	Return bool
	// Limits, when set, are enforced instead of the policy's full limit,
	// as a lease's share is. The algorithm must be the policy's.
	Limits *policy.Limits
}

// ticket resolves r against the engine's policies (admission.Resolve).
func (e *Engine) ticket(r Request) (*admission.Ticket, error) {
	p, ok := e.Policy(r.Policy)
	if !ok {
		return nil, fmt.Errorf("%w %q", admission.ErrUnknownPolicy, r.Policy)
	}
	if r.Cost < 1 && !r.Check {
		return nil, fmt.Errorf("policy %q: %w, got %d", p.Name, policy.ErrInvalidCost, r.Cost)
	}
	l := p.Limits()
	if r.Limits != nil {
		if l = *r.Limits; l.Algorithm != p.Algorithm {
			return nil, fmt.Errorf("%w: policy %q: limits for %s, policy uses %s", admission.ErrInvalidRequest, p.Name, l.Algorithm, p.Algorithm)
		}
	}
	t, err := admission.Resolve(p, admission.Request{Policy: r.Policy, Attributes: r.Attributes, Cost: r.Cost, Check: r.Check, IdempotencyKey: r.IdempotencyKey, Return: r.Return}, l)
	return &t, err
}

// Check decides one request in one round trip (Decide): with
// Config.Pipelines, together with the other checks queued meanwhile.
func (e *Engine) Check(ctx context.Context, r Request) (policy.Decision, error) {
	t, err := e.ticket(r)
	if err != nil {
		return policy.Decision{}, err
	}
	res := e.Decide(ctx, []*admission.Ticket{t})[0]
	return res.Decision, res.Err
}

// CheckBatch decides many requests as Decide does. Requests that fail
// validation get their error and are not sent.
func (e *Engine) CheckBatch(ctx context.Context, rs []Request) []Result {
	out := make([]Result, len(rs))
	var ts []*admission.Ticket
	var idx []int
	for i, r := range rs {
		t, err := e.ticket(r)
		if err != nil {
			out[i].Err = err
			continue
		}
		ts = append(ts, t)
		idx = append(idx, i)
	}
	for j, res := range e.Decide(ctx, ts) {
		out[idx[j]] = res
	}
	return out
}
