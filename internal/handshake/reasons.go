package handshake

// Failure reasons, for metrics and logs.
const (
	ReasonTimeout     = "timeout"      // no handshake (or first byte) within the deadline
	ReasonError       = "error"        // the handshake failed: not TLS, a bad certificate, a reset
	ReasonSourceLimit = "source-limit" // the oldest of its source's PerSource pending, closed for a new one from there
	ReasonEvicted     = "evicted"      // the oldest of Total pending, closed for a new one
)
