package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/clock"
	"github.com/quota-lease/quota-lease/internal/logs"
)

// EtcdError is an etcd call of the coordinator that failed: etcd did not
// answer in time, could not be reached, or refused the coordinator. Its
// message names etcd, the endpoints and what to do, so that a log line, a
// /readyz answer and an admin command's error all point at the broken
// dependency rather than at a timeout.
type EtcdError struct {
	Op        string   // what the coordinator was doing: "read policies"
	Endpoints []string // the etcd endpoints it uses
	Err       error    // the etcd client's error
}

func (e *EtcdError) Error() string {
	problem, action := etcdProblem(e.Err)
	return fmt.Sprintf("%s at %s (%s: %v): %s", problem, strings.Join(e.Endpoints, ","), e.Op, e.Err, action)
}

func (e *EtcdError) Unwrap() error { return e.Err }

// GRPCStatus makes an EtcdError an UNAVAILABLE answer with its message,
// so that a handler can return it as it is.
func (e *EtcdError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }

// etcdProblem says in words what err, from an etcd call, means for an
// operator, and what to do about it.
func etcdProblem(err error) (problem, action string) {
	switch {
	case errors.Is(err, rpctypes.ErrNoSpace):
		return "etcd is out of space (its NOSPACE alarm is raised)", "compact and defragment etcd, then disarm the alarm " +
			"(etcdctl compact, etcdctl defrag, etcdctl alarm disarm; docs/runbook.md, \"etcd's space\"); until then etcd " +
			"stores nothing: no policy change, no new grant, and agents ride out on their leases, then their degraded budgets"
	case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrPermissionDenied),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrUserEmpty):
		return "etcd refuses this coordinator", "give it an etcd user with read and write access to --prefix " +
			"(--etcd-user, and its password in --etcd-password-file or QUOTALEASE_ETCD_PASSWORD) and restart it"
	default:
		return "etcd unreachable", "check that etcd runs and that this coordinator reaches it at --etcd-endpoints " +
			"(with --etcd-cacert, --etcd-cert and --etcd-key if etcd serves TLS); until it does, no leader is elected, " +
			"nothing is granted or stored, and agents ride out on their leases, then their degraded budgets " +
			"(docs/runbook.md, \"When etcd is down\")"
	}
}

// isEtcdFailure reports whether err is etcd's doing: a timeout, a failed
// connection or an etcd server error, as opposed to a bad record read from
// etcd or a caller that gave up.
func isEtcdFailure(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// etcdHealth is what this replica's own etcd calls last found: whether
// etcd answers, and since when it does not. Failures are logged paced
// (logs.Outage) at error level: an outage is a few lines, the first as
// soon as a call fails or times out. Safe for concurrent use.
type etcdHealth struct {
	endpoints []string
	log       hclog.Logger
	clock     clock.Clock

	mu   sync.Mutex
	err  *EtcdError // the last call's failure; nil: it worked (or none was made)
	down logs.Outage
}

func newEtcdHealth(endpoints []string, log hclog.Logger, clk clock.Clock) *etcdHealth {
	return &etcdHealth{endpoints: endpoints, log: log, clock: clk,
		down: logs.Outage{What: "etcd calls", Interval: 30 * time.Second, Level: hclog.Error}}
}

// record notes the outcome of an etcd call: nil for success, or its
// failure.
func (h *etcdHealth) record(failure *EtcdError) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = failure
	if failure == nil {
		h.down.OK(h.log, h.clock.Now())
		return
	}
	h.down.Failed(h.log, h.clock.Now(), "endpoints", strings.Join(h.endpoints, ","), "error", failure.Error())
}

// last returns the last etcd call's failure, nil if it worked.
func (h *etcdHealth) last() *EtcdError {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// problem returns the failure of the last etcd call, with how long calls
// have been failing, or nil if the last one worked.
func (h *etcdHealth) problem() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		return nil
	}
	return fmt.Errorf("%w (failing for %s)", h.err, h.clock.Now().Sub(h.down.Since()).Round(100*time.Millisecond))
}
