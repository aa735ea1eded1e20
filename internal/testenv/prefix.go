package testenv

import (
	"fmt"
	"sync/atomic"
	"testing"
)

var prefixSeq atomic.Int64

// Prefix returns an etcd key prefix that no other call in this process
// returns: "/test/", the test's name and a sequence number. Tests sharing
// the etcd of MainWithEtcd keep their keys under their own prefixes.
func Prefix(t testing.TB) string {
	return fmt.Sprintf("/test/%s/%d", t.Name(), prefixSeq.Add(1))
}
