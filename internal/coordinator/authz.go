package coordinator

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// access is who may call a method.
type access int

const (
	// regionAccess: an agent of the region the request names.
	regionAccess access = iota + 1
	// policyAccess: a region's agents (they load their policies) and
	// both operator roles.
	policyAccess
	// readAccess: role admin or viewer.
	readAccess
	// writeAccess: role admin.
	writeAccess
)

// methodAccess lists every method served; a method not listed is refused
// to everyone.
var methodAccess = map[string]access{
	pb.LeaseService_Lease_FullMethodName:         regionAccess,
	pb.AdminService_SetPolicy_FullMethodName:     writeAccess,
	pb.AdminService_DeletePolicy_FullMethodName:  writeAccess,
	pb.AdminService_ReleaseRegion_FullMethodName: writeAccess,
	pb.AdminService_SetRegion_FullMethodName:     writeAccess,
	pb.AdminService_Rebalance_FullMethodName:     writeAccess,
	pb.AdminService_GetPolicy_FullMethodName:     policyAccess,
	pb.AdminService_ListPolicies_FullMethodName:  policyAccess,
	pb.AdminService_ListLeases_FullMethodName:    readAccess,
	pb.AdminService_ListRegions_FullMethodName:   readAccess,
	pb.AdminService_GetBound_FullMethodName:      readAccess,
}

// refusals counts refused calls by method and reason, for the metrics,
// and paces their logging: a flood of forged calls must not flood the log.
type refusals struct {
	m sync.Map // "method\x00reason" -> *atomic.Int64

	mu     sync.Mutex
	logged map[string]time.Time
}

// add counts one refusal and reports whether to log it: the first of its
// kind in any second.
func (r *refusals) add(method, reason string) bool {
	key := method + "\x00" + reason
	v, _ := r.m.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged == nil {
		r.logged = map[string]time.Time{}
	}
	now := time.Now()
	if now.Sub(r.logged[key]) < time.Second {
		return false
	}
	r.logged[key] = now
	return true
}

// callRate limits calls per identity (token buckets of rate per second,
// burst twice that).
type callRate struct {
	rate float64
	mu   sync.Mutex
	by   map[string]*rate.Limiter
}

func (r *callRate) allow(who string) bool {
	if r.rate <= 0 {
		return true
	}
	r.mu.Lock()
	l := r.by[who]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(r.rate), int(2*r.rate)+1)
		r.by[who] = l
	}
	r.mu.Unlock()
	return l.Allow()
}
