package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// plainRPCError turns an admin call's error into what an operator can act
// on: a coordinator's answer is shown as its message alone (it names the
// broken dependency, etcd for one, and what to do), without gRPC's
// "rpc error: code = ... desc =" wrapping, and a call that got no answer
// in time says so, and where to look, instead of showing transport text
// such as "stream terminated by RST_STREAM with error code: CANCEL".
// timeout is the command's --timeout.
func plainRPCError(err error, timeout time.Duration) error {
	if err == nil {
		return nil
	}
	noAnswer := fmt.Sprintf("no answer within --timeout %s: the coordinator may be waiting for etcd or overloaded; "+
		"its log and its /readyz say which (docs/runbook.md)", timeout)
	var se interface {
		error
		GRPCStatus() *status.Status
	}
	if !errors.As(err, &se) {
		if errors.Is(err, context.DeadlineExceeded) {
			return &plainError{msg: noAnswer, err: err}
		}
		return err
	}
	st := se.GRPCStatus()
	plain := st.Message()
	if st.Code() == codes.DeadlineExceeded || st.Code() == codes.Canceled {
		plain = noAnswer
	}
	return &plainError{msg: strings.Replace(err.Error(), se.Error(), plain, 1), err: err}
}

// plainError is an error shown with another message; it unwraps to the
// original.
type plainError struct {
	msg string
	err error
}

func (e *plainError) Error() string { return e.msg }
func (e *plainError) Unwrap() error { return e.err }
