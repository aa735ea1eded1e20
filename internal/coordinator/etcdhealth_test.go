package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An EtcdError names etcd, the endpoints and what to do, and is an
// UNAVAILABLE answer as it is; etcd refusing the coordinator's user says
// to fix the credentials, not to restart etcd.
func TestEtcdErrorSaysWhatToDo(t *testing.T) {
	down := &EtcdError{Op: "read a policy", Endpoints: []string{"https://etcd-1:2379", "https://etcd-2:2379"}, Err: context.DeadlineExceeded}
	if msg := down.Error(); !strings.Contains(msg, "etcd unreachable at https://etcd-1:2379,https://etcd-2:2379 (read a policy: context deadline exceeded)") ||
		!strings.Contains(msg, "check that etcd runs") {
		t.Errorf("unreachable: %s", msg)
	}
	if st, _ := status.FromError(fmt.Errorf("store policies: %w", down)); st.Code() != codes.Unavailable {
		t.Errorf("wrapped EtcdError answers %v, want Unavailable", st.Code())
	}
	refused := &EtcdError{Op: "connect", Endpoints: []string{"https://etcd-1:2379"}, Err: rpctypes.ErrAuthFailed}
	if msg := refused.Error(); !strings.Contains(msg, "etcd refuses this coordinator") || !strings.Contains(msg, "--etcd-password-file") {
		t.Errorf("refused: %s", msg)
	}
	for _, c := range []struct {
		err  error
		etcd bool
	}{
		{context.DeadlineExceeded, true},
		{status.Error(codes.Unavailable, "connection refused"), true},
		{rpctypes.ErrPermissionDenied, true},
		{fmt.Errorf("load state from etcd: %w", context.DeadlineExceeded), true},
		{&json.SyntaxError{}, false},
		{errors.New("etcd key /x: bad record"), false},
	} {
		if got := isEtcdFailure(c.err); got != c.etcd {
			t.Errorf("isEtcdFailure(%v) = %v, want %v", c.err, got, c.etcd)
		}
	}
}
