package rlqs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// callerLoad is what one caller holds on this agent: its streams and
// their buckets, against Config.MaxStreamsPerCaller and
// MaxBucketsPerCaller. e.mu guards it.
type callerLoad struct {
	name             string
	streams, buckets int
}

// callerOf names who opened a stream, for the per-caller budgets: its
// verified client certificate ("cert " and the first 8 bytes of its
// SHA-256: a fleet of Envoys sharing one certificate is one caller), or,
// without one (plaintext, or TLS without client certificates), its
// address's host.
func callerOf(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		sum := sha256.Sum256(ti.State.PeerCertificates[0].Raw)
		return "cert " + hex.EncodeToString(sum[:8])
	}
	return "address " + hostOf(p.Addr)
}

// groupOf names the caller of a stream together with the host it comes
// from: a policy identity's instance places are shared fairly between
// such groups (edge.Slot.Group), so that many streams from one host, one
// certificate, cannot take the places of the Envoys of other hosts that
// share it.
func groupOf(ctx context.Context, caller string) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return caller + " at " + hostOf(p.Addr)
	}
	return caller
}

// hostOf is addr's host.
func hostOf(addr net.Addr) string {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}
