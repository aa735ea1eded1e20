package quotalease

import (
	"maps"
	"time"

	"github.com/quota-lease/quota-lease/edge/envoy"
)

// Bucket is a handle on one bucket of a Client, for a caller that decides
// many requests of the same bucket (a per-tenant handler, a background
// job): its decisions skip building the bucket's key from a map, which is
// most of what Client.Allow costs. A Bucket stays valid for the client's
// life: a bucket the agent abandoned or the client forgot starts again
// with the handle's next request. Safe for concurrent use.
type Bucket struct {
	c   *Client
	key string
	id  map[string]string
	b   *bucket // the cached entry last used; c.mu guards it
}

// Bucket returns a handle on bucket.
func (c *Client) Bucket(bucket map[string]string) *Bucket {
	return &Bucket{c: c, key: Key(bucket), id: maps.Clone(bucket)}
}

// Allow decides one request of the bucket, as Client.Allow.
func (h *Bucket) Allow() bool {
	allowed, _, _ := h.decide(1, false)
	return allowed
}

// AllowN decides a request that costs n units of the bucket, as
// Client.AllowN.
func (h *Bucket) AllowN(n uint64) Decision {
	allowed, st, now := h.decide(n, true)
	return decisionOf(allowed, n, st, now, h.c.cfg.ReportInterval)
}

func (h *Bucket) decide(n uint64, state bool) (bool, envoy.State, time.Duration) {
	c := h.c
	now := c.cfg.Clock.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.b == nil || h.b.gone {
		if h.b = c.buckets[h.key]; h.b == nil {
			h.b = c.add(h.key, h.id, now)
		}
	}
	return c.take(h.b, n, now, state)
}
