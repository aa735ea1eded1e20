package rlqs

import (
	"cmp"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/quota-lease/quota-lease/edge"
	"github.com/quota-lease/quota-lease/internal/logs"
)

// An RLQS stream and the buckets it reports, as the engine holds them.

// rlqsStream is one Envoy instance's stream.
type rlqsStream struct {
	id     uint64
	domain string
	// library: the client is the quota-lease client library, not an Envoy
	// (it names itself when the stream opens).
	library bool
	// caller is what the stream's caller holds (its budgets); group names
	// it with the host the stream comes from (groupOf).
	caller *callerLoad
	group  string
	out    chan *rlqsv3.RateLimitQuotaResponse
	done   chan struct{}
	slots  map[string]*rlqsSlot // by quotalease.Key
	// allowAll: buckets that nothing limits, and when ALLOW_ALL was sent.
	allowAll map[string]time.Time
	// second: the buckets refused as another spelling of an identity the
	// stream holds, each abandoned once (Engine.refuseSecond).
	second   map[string]bool
	pend     []*rlqsv3.RateLimitQuotaResponse_BucketAction
	tokens   float64 // the message pace's bucket
	tokensAt time.Time
	refused  logs.Outage // paced log of refused buckets
}

// rlqsOutbox is how many messages a stream may have waiting to be sent;
// more are dropped (and counted), the assignments they held counted as
// sent: a slow Envoy gets its next refresh later.
const rlqsOutbox = 8

// send queues m on the stream without waiting.
func (st *rlqsStream) send(m *rlqsv3.RateLimitQuotaResponse, ms *metrics) {
	select {
	case st.out <- m:
		ms.messages.Inc()
	default:
		ms.dropped.Inc()
	}
}

// paced reports whether the stream may send one more message at now.
func (st *rlqsStream) paced(now time.Time, cfg Config) bool {
	st.tokens = min(float64(cfg.ReportBurst), st.tokens+now.Sub(st.tokensAt).Seconds()*cfg.ReportsPerSecond)
	st.tokensAt = now
	if st.tokens < 1 {
		return false
	}
	st.tokens--
	return true
}

// rlqsSlotID is one bucket on one stream: one Envoy instance's view of
// one policy identity.
type rlqsSlotID struct {
	stream uint64
	bucket string
}

// edgeKey is one policy identity the edge serves from this agent.
type edgeKey = edge.Served[rlqsSlotID]

// rlqsSlot is a bucket an Envoy instance reports: the key's edge.Slot of
// it, and where to send its actions.
type rlqsSlot struct {
	*edge.Slot
	st  *rlqsStream
	id  *rlqsv3.BucketId
	key *edgeKey
}

func compareSlots(a, b rlqsSlotID) int {
	return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.bucket, b.bucket))
}
