package agent

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quota-lease/quota-lease/internal/logs"
	"github.com/quota-lease/quota-lease/lease"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
	"github.com/quota-lease/quota-lease/regional"
)

// LeaseClient is what the agent needs of the coordinator.
// *leaseapi.Client satisfies it.
type LeaseClient interface {
	Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error)
}

// leaser holds this process's leases on the global policies and renews
// them. Every agent instance of a region leases on its own: the
// coordinator counts a region at the largest of its instances' grants,
// since they enforce one Redis bucket whose refill never exceeds the
// largest rate any caller passes. Demand (the hottest identity's) is summed
// across instances through Redis, an upper bound of the region's, so the
// coordinator sees the region's demand, not one instance's.
type leaser struct {
	region, instance, nonce string
	coord                   LeaseClient
	timing                  lease.Timing
	now                     func() time.Time
	log                     hclog.Logger
	m                       *metrics
	// stale is called when a grant was computed from another policy than
	// the one loaded: the policies changed, reload them now.
	stale func()

	mu        sync.Mutex
	metricsAt time.Time // the last updateMetrics
	quotas    map[string]*quotaLease
	instances int // live instances in the region, at least 1
	// shared is the region's Redis, where grants are saved before they are
	// acknowledged, and where the process holding a name is recorded.
	shared *regional.Region
	down   logs.Outage // renewals failing at the transport: logged paced
	// held paces the log of refusals because another process holds this
	// instance name, and heldUntil is when to ask again (leaseapi.InstanceHeld):
	// a refused agent backs off instead of asking ten times a second.
	held      logs.Outage
	heldUntil time.Time
	// wasHeld says the last answer refused the name (succeed looks for a
	// stopped predecessor), replaces is the predecessor the next request
	// names, and named whether a request under the name has succeeded
	// (publish then records this process as its holder): succession.go.
	// predecessor is the stopped process this one succeeded, once known.
	wasHeld               bool
	replaces, predecessor string
	named                 bool
}

type quotaLease struct {
	a      *lease.Holder
	policy *policy.Policy
	fp     uint64 // policy.Fingerprint()
	meter  *meter
	region int64 // region-wide demand (amount units), from Redis
	// savedID is the grant last saved to Redis (saveGrants), durable the
	// last one whose save Redis confirmed: only that one is acknowledged,
	// since a restarted agent enforces what its region saved, and the
	// coordinator stops counting a grant once a newer one is acknowledged.
	// The coordinator sends identity shares as changes to it.
	savedID string
	durable lease.Grant
	// acked is the grant the last renewal presented (durable, unless the
	// edge held it back: renewalEdge).
	acked lease.Grant
	// report is what the coordinator holds of this instance's identity
	// demands, demandsTaken whether its last answer said it takes them as
	// changes (else the agent sends whole reports, as before changes).
	report       lease.DemandReport
	demandsTaken bool
}

func newLeaser(
	shared *regional.Region,
	instance string,
	coord LeaseClient,
	t lease.Timing,
	now func() time.Time,
	log hclog.Logger,
	m *metrics,
	stale func(),
) *leaser {
	return &leaser{down: logs.Outage{What: "lease renewals", Interval: 30 * time.Second, Level: hclog.Warn},
		held:   logs.Outage{What: "lease requests under this instance name", Interval: 30 * time.Second, Level: hclog.Warn},
		shared: shared, region: shared.Name(), instance: instance, nonce: regional.NewNonce(instance, now()),
		coord: coord, timing: t, now: now, log: log, m: m, stale: stale, quotas: map[string]*quotaLease{}, instances: 1}
}

// identityDemand is this instance's identities' own demand
// (lease.IdentityDemands), which q.report turns into the changes a
// renewal carries.
func (q *quotaLease) identityDemand(now time.Time, instances int) map[string]int64 {
	g, _ := q.a.Grant()
	q.meter.mu.Lock()
	defer q.meter.mu.Unlock()
	most := lease.Reported(q.policy.IdentityShareLimit())
	same := func(id string) string { return id }
	return lease.IdentityDemands(q.meter.m, now.UnixMilli(), g, q.policy.Limits(), instances, most, same)
}

// meter is a lease.Meter (the hottest identity's demand) safe for the
// agent's concurrent checks.
type meter struct {
	mu sync.Mutex
	m  *lease.Meter[string]
}

func newMeter(track int) *meter { return &meter{m: lease.NewMeter[string](track)} }

// warm reports whether the meter has measured long enough (since its
// first look) for its rates to say the demand: a second.
func (m *meter) warm(now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m.Age(now.UnixMilli()) >= time.Second
}

// add counts cost asked by identity over span up to now (lease.Meter.Add);
// own says it holds shares of its own, which serve it instead of the
// region's default share (lease.Meter.AddOwn).
func (m *meter) add(identity string, cost int64, own bool, span time.Duration, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if own {
		m.m.AddOwn(identity, cost, span.Milliseconds(), now.UnixMilli())
		return
	}
	m.m.Add(identity, cost, span.Milliseconds(), now.UnixMilli())
}

// setTracks changes how many identities the meter tracks per bucket (a
// changed identity_shares).
func (m *meter) setTracks(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.SetTracks(n)
}

func (m *meter) rate(now time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m.Rate(now.UnixMilli())
}
