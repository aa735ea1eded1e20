package leaseapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Client talks to a set of coordinator replicas: it sends each call to the
// replica it believes leads, follows the leader hint of a follower's
// refusal, and otherwise tries the next address. It is safe for concurrent
// use.
type Client struct {
	addrs []string
	creds credentials.TransportCredentials
	// cluster is the cluster ID this client talks to: set (SetClusterID)
	// or learnt from the first answer, then sent with every call.
	cluster string

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	leader string
	// noHints: use only the configured addresses, never a follower's
	// leader hint (see SetFollowHints).
	noHints bool
	// suspect holds replicas that timed out or failed at the transport,
	// until when: they are tried last, and hints to them are not followed
	// while another replica is left, so a hung leader costs one attempt.
	suspect map[string]time.Time
}

// SuspectFor is how long a replica that timed out or failed at the
// transport is tried last.
const SuspectFor = 5 * time.Second

// perTry bounds one attempt of a call at one replica (a CallOption the
// client's interceptor applies), so that a hung replica cannot use up the
// whole call's deadline.
type perTry struct {
	grpc.EmptyCallOption
	d time.Duration
}

// SetFollowHints turns following followers' leader hints on (the default)
// or off. Turn it off when the client reaches the replicas through proxies
// or NAT that their advertised addresses would bypass: it then finds the
// leader among its own addresses.
func (c *Client) SetFollowHints(follow bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noHints = !follow
}

// NewClient returns a client of the replicas at addrs (host:port). It
// connects lazily.
func NewClient(addrs []string) (*Client, error) {
	var clean []string
	for _, a := range addrs {
		if a = strings.TrimSpace(a); a != "" {
			clean = append(clean, a)
		}
	}
	if len(clean) == 0 {
		return nil, fmt.Errorf("no coordinator address given")
	}
	return &Client{
		addrs:   clean,
		conns:   map[string]*grpc.ClientConn{},
		creds:   insecure.NewCredentials(),
		suspect: map[string]time.Time{},
	}, nil
}

// SetClusterID pins the cluster this client talks to: every call carries
// it, and a coordinator of another cluster refuses the call before acting.
// Without it the client pins the cluster of the first answer it gets.
func (c *Client) SetClusterID(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cluster = id
}

// ClusterID returns the cluster this client talks to ("" before the
// first answer).
func (c *Client) ClusterID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cluster
}

// ErrWrongCluster reports an answer from another deployment's coordinator.
var ErrWrongCluster = errors.New("answer from another cluster")

// stampCluster is a client interceptor: it sends the pinned cluster ID
// with the call and checks (or pins) the one in the answer.
func (c *Client) stampCluster(
	ctx context.Context,
	method string,
	req, reply any,
	cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker,
	opts ...grpc.CallOption,
) error {
	for _, o := range opts {
		if pt, ok := o.(perTry); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, pt.d)
			defer cancel()
		}
	}
	if want := c.ClusterID(); want != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, ClusterHeader, want)
	}
	var tr metadata.MD
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&tr))...)
	if got := tr.Get(ClusterHeader); len(got) > 0 {
		c.mu.Lock()
		if c.cluster == "" {
			c.cluster = got[0]
		}
		want := c.cluster
		c.mu.Unlock()
		if got[0] != want && err == nil { // (a refusal already says so)
			return fmt.Errorf("%w: %s answered for cluster %s, but this client talks to cluster %s (a stale "+
				"address or leader hint?)", ErrWrongCluster, cc.Target(), got[0], want)
		}
	}
	return err
}

// UseTLS makes connections opened from now on use TLS with cfg (see
// internal/mtls); call it before the first call.
func (c *Client) UseTLS(cfg *tls.Config) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.creds = credentials.NewTLS(cfg)
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.conns {
		cc.Close()
	}
	c.conns = map[string]*grpc.ClientConn{}
	return nil
}

// Conn returns the client's connection to replica addr (one per address,
// made on first use), for callers that need a service client of their own.
func (c *Client) Conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds), grpc.WithUnaryInterceptor(c.stampCluster),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxAnswerBytes)))
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Order returns the replicas in the order the next call tries them: the
// known leader first, suspects last.
func (c *Client) Order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var good, bad []string
	add := func(a string) {
		if c.suspect[a].After(now) {
			bad = append(bad, a)
		} else {
			good = append(good, a)
		}
	}
	if c.leader != "" {
		add(c.leader)
	}
	for _, a := range c.addrs {
		if a != c.leader {
			add(a)
		}
	}
	return append(good, bad...)
}

// markSuspect records that addr timed out or failed at the transport.
func (c *Client) markSuspect(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.suspect[addr] = time.Now().Add(SuspectFor)
	if c.leader == addr {
		c.leader = ""
	}
}

// Suspect reports whether replica addr timed out or failed at the
// transport within SuspectFor, and so is tried last.
func (c *Client) Suspect(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.suspect[addr].After(time.Now())
}

// tryTimeout is one attempt's share of what is left of ctx's deadline:
// split among the replicas still to try (at least two shares, so a hung
// first replica leaves time for another), never under 50 ms; 2 s without
// a deadline.
func tryTimeout(ctx context.Context, left int) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 2 * time.Second
	}
	return max(time.Until(dl)/time.Duration(max(2, left)), 50*time.Millisecond)
}

// Call runs fn against the leader. fn must pass opts to its RPC, so the
// leader hint can be read from a refusal. While every replica answers
// UNAVAILABLE (an election or failover in progress, or none reachable) it
// retries with backoff until ctx ends.
func (c *Client) Call(ctx context.Context, fn func(cc *grpc.ClientConn, opts ...grpc.CallOption) error) error {
	backoff := 50 * time.Millisecond
	for {
		retry, err := c.callOnce(ctx, fn)
		if !retry {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// callOnce tries every replica once, following leader hints. retry is
// true when all answered UNAVAILABLE, or could not be reached, and not
// every one for its certificate.
func (c *Client) callOnce(
	ctx context.Context,
	fn func(cc *grpc.ClientConn, opts ...grpc.CallOption) error,
) (retry bool, err error) {
	queue := c.Order()
	tried := map[string]bool{}
	var last error
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		cc, err := c.Conn(addr)
		if err != nil {
			last = err
			continue
		}
		var md metadata.MD
		err = fn(cc, grpc.Trailer(&md), perTry{d: tryTimeout(ctx, len(queue)+1)})
		if err == nil {
			c.mu.Lock()
			c.leader = addr
			delete(c.suspect, addr)
			c.mu.Unlock()
			return false, nil
		}
		last = fmt.Errorf("coordinator %s: %w", addr, err)
		hint := md.Get(LeaderTrailer)
		switch code := status.Code(err); {
		case code == codes.DeadlineExceeded && ctx.Err() == nil:
			// This replica timed out. The request may still have been
			// applied there (a renewal booked), so it is not sent again
			// within this call; the replica is suspect, and the next call
			// tries the others first.
			c.markSuspect(addr)
			return false, err
		case code == codes.Unavailable && refusedCertificate(err):
			// The replica's certificate (or ours) was refused: trying it
			// again within this call changes nothing, and the reason is
			// clearer now than at the deadline. The others are tried.
			c.markSuspect(addr)
			continue
		case code == codes.Unavailable && len(md.Get(ClusterHeader)) == 0:
			// Failed at the transport (every answer of a replica, refusals
			// too, carries the cluster ID): try the others at once.
			c.markSuspect(addr)
			retry = true
			continue
		case code != codes.Unavailable:
			return false, err // an answer, not a routing problem
		}
		retry = true
		c.mu.Lock()
		follow := !c.noHints
		c.mu.Unlock()
		if follow && len(hint) > 0 && !tried[hint[0]] && (!c.Suspect(hint[0]) || len(queue) == 0) {
			c.mu.Lock()
			c.leader = hint[0]
			c.mu.Unlock()
			queue = append([]string{hint[0]}, queue...)
		}
	}
	if last == nil {
		return false, ctx.Err()
	}
	return retry && ctx.Err() == nil, last
}

// refusedCertificate reports whether err is a TLS handshake that failed on
// a certificate: a coordinator's that does not name the coordinator role,
// an expired one, or one of another CA. gRPC reports it as UNAVAILABLE
// text only.
func refusedCertificate(err error) bool {
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, "authentication handshake failed") {
		return false
	}
	// Not a connection cut during the handshake (EOF, reset, timeout): a
	// replica restarting is tried again.
	return strings.Contains(msg, "x509:") || strings.Contains(msg, "certificate") || strings.Contains(msg, "wrong server")
}

// Lease sends a lease request to the leader.
func (c *Client) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	var resp *pb.LeaseResponse
	err := c.Call(ctx, func(cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		var err error
		resp, err = pb.NewLeaseServiceClient(cc).Lease(ctx, req, opts...)
		return err
	})
	return resp, err
}
