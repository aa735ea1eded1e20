package lease

import (
	"time"

	"github.com/quota-lease/quota-lease/scale"
)

// A usage report (Envoy's instances report every 5 s what they admitted
// and denied since their last) is a cost asked over a span that ended as
// it arrives. Counted at once, it lands whole in one bucket, and a window
// of the meter holds one report of an instance or two by where they fall:
// it reads as half or twice the rate asked. Spread back over its span, it
// reads low until the next report fills in what the last left unreported.
// So the meter counts it as a flow at its rate over as long as its span
// from its arrival: the rate asked, a span late, and every bucket whole.

// flow is cost reported over span ms, counted from start on at cost/span
// a ms until end; counted up to from so far.
type flow struct {
	cost, span int64
	start, end int64
	from       int64
	own        bool
}

// maxFlowMs is the longest a flow lasts: the four buckets the meter keeps.
// A report over longer keeps its rate; what falls beyond is not counted.
const maxFlowMs = 4 * int64(MeterSpan/time.Millisecond)

// flow counts cost asked by id over the spanMs up to nowMs as a flow, unless
// the current bucket tracks too many identities already to count it.
func (m *Meter[K]) flow(id K, cost, spanMs, nowMs int64, own bool) {
	if _, ok := m.cur[id]; !ok && len(m.cur) >= m.track && m.flows[id] == nil {
		return
	}
	m.flows[id] = append(m.flows[id], flow{cost: cost, span: spanMs, start: nowMs,
		end: nowMs + min(spanMs, maxFlowMs), from: nowMs, own: own})
}

// accrue counts what the flows carried up to untilMs, at most the end of
// the current bucket, and forgets the flows that ended.
func (m *Meter[K]) accrue(untilMs int64) {
	for id, fs := range m.flows {
		keep := fs[:0]
		for _, f := range fs {
			if to := min(f.end, untilMs); to > f.from {
				m.add(id, scale.Down(f.cost, to-f.start, f.span)-scale.Down(f.cost, f.from-f.start, f.span), f.own)
				f.from = to
			}
			if f.from < f.end {
				keep = append(keep, f)
			}
		}
		switch len(keep) {
		case 0:
			delete(m.flows, id)
		case len(fs): // kept in place, as they were
		default:
			m.flows[id] = keep
		}
	}
}
