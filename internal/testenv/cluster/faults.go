package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// FaultKind names a fault the robustness suite injects into a running
// cluster.
type FaultKind string

// The fault kinds.
const (
	// KillLeader kills the leading coordinator (SIGKILL) and starts it
	// again after For.
	KillLeader FaultKind = "kill-leader"
	// PauseLeader stops the leading coordinator (SIGSTOP) for For.
	PauseLeader FaultKind = "pause-leader"
	// KillAgent kills Region's agent and starts it again after For.
	KillAgent FaultKind = "kill-agent"
	// RestartRedis kills Region's Redis, which comes back empty at once.
	RestartRedis FaultKind = "restart-redis"
	// PauseRedis stops Region's Redis for Down of every Period, for For.
	PauseRedis FaultKind = "pause-redis"
	// FlapLatency delays Region's Redis traffic by Delay each way for Down
	// of every Period, for For: latency flapping around the check timeout.
	FlapLatency FaultKind = "flap-latency"
	// PartitionRegion cuts Region off from every coordinator for For.
	PartitionRegion FaultKind = "partition"
	// ChangeLimit stores the policy with limit Limit.
	ChangeLimit FaultKind = "change-limit"
	// ChangeFailure stores the policy with the injector's failure mode
	// number Failure.
	ChangeFailure FaultKind = "change-failure"
)

var faultKinds = []FaultKind{
	KillLeader, PauseLeader, KillAgent,
	RestartRedis, PauseRedis, FlapLatency,
	PartitionRegion, ChangeLimit, ChangeFailure,
}

// Fault is one scheduled fault.
type Fault struct {
	Kind   FaultKind
	At     time.Duration // from the start of the run
	For    time.Duration
	Region string
	// Period, Down and Delay shape PauseRedis and FlapLatency.
	Period, Down, Delay time.Duration
	// Limit is ChangeLimit's new limit; Failure, ChangeFailure's new
	// failure mode (an index into the injector's Failures).
	Limit   float64
	Failure int
}

func (f Fault) String() string {
	s := fmt.Sprintf("%6.1fs %-13s", f.At.Seconds(), f.Kind)
	switch f.Kind {
	case ChangeLimit:
		return s + fmt.Sprintf(" limit %v", f.Limit)
	case ChangeFailure:
		return s + fmt.Sprintf(" failure mode #%d", f.Failure)
	case KillLeader, PauseLeader:
		return s + fmt.Sprintf(" for %v", f.For)
	case PauseRedis, FlapLatency:
		return s + fmt.Sprintf(" %s for %v: %v of every %v (delay %v)", f.Region, f.For, f.Down, f.Period, f.Delay)
	default:
		return s + fmt.Sprintf(" %s for %v", f.Region, f.For)
	}
}

// Schedule draws a fault schedule for a run of length dur from seed: one
// fault about every 3 s, of every kind, at random moments (faults may
// overlap), each over before the run's last 5 s. The same seed, length
// and regions give the same schedule.
func Schedule(seed uint64, dur time.Duration, regions []string) []Fault {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	span := dur - 7*time.Second // faults start after 2 s and end 5 s early
	if span <= 0 {
		return nil
	}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
	n := max(1, int(dur/(3*time.Second)))
	out := make([]Fault, 0, n)
	for i := 0; i < n; i++ {
		f := Fault{Kind: faultKinds[r.IntN(len(faultKinds))], Region: regions[r.IntN(len(regions))]}
		f.For = between(500*time.Millisecond, 4*time.Second)
		f.At = 2*time.Second + between(0, max(0, span-f.For))
		switch f.Kind {
		case PauseRedis, FlapLatency:
			// Around the agents' 20 ms check timeout.
			f.Period = between(20*time.Millisecond, 100*time.Millisecond)
			f.Down = between(5*time.Millisecond, f.Period-5*time.Millisecond)
			f.Delay = between(5*time.Millisecond, 30*time.Millisecond)
		case ChangeLimit:
			f.For = 0
			f.Limit = float64(5 * (1 + r.IntN(6))) // 5..30 per second
		case ChangeFailure:
			f.For = 0
			f.Failure = r.IntN(1 << 16)
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// PolicyChange is a policy stored during a run: sent at Sent, acknowledged
// by the coordinator at Acked (zero if never).
type PolicyChange struct {
	Sent, Acked time.Time
	Policy      *policy.Policy
}

// Injector runs a fault schedule against a cluster. Faults on one target
// (a process, a region's Redis or proxies) wait for each other; all of them
// are undone before Run returns.
type Injector struct {
	c *Cluster
	// Policy renders the policy under test with a limit and a failure
	// mode (one of Failures), for ChangeLimit and ChangeFailure.
	Policy   func(limit float64, failure string) string
	Failures []string
	// Logf, when set, is told each fault as it starts.
	Logf func(format string, args ...any)

	mu      sync.Mutex
	limit   float64 // the policy's current limit and failure mode
	failure string
	targets map[string]*sync.Mutex
	changes []PolicyChange
	ran     map[FaultKind]int
}

// NewInjector returns an injector for c, whose policy was stored with
// limit and failures[0].
func NewInjector(
	c *Cluster,
	policy func(limit float64, failure string) string,
	limit float64,
	failures []string,
) *Injector {
	return &Injector{c: c, Policy: policy, Failures: failures, limit: limit, failure: failures[0],
		targets: map[string]*sync.Mutex{}, ran: map[FaultKind]int{}}
}

func (in *Injector) target(name string) *sync.Mutex {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.targets[name] == nil {
		in.targets[name] = &sync.Mutex{}
	}
	return in.targets[name]
}

// Run injects faults, timed from start, until all have run or ctx ends.
func (in *Injector) Run(ctx context.Context, start time.Time, faults []Fault) {
	var wg sync.WaitGroup
	for _, f := range faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(start.Add(f.At))):
			}
			if in.Logf != nil {
				in.Logf("fault %s", f)
			}
			if in.inject(ctx, f) {
				in.mu.Lock()
				in.ran[f.Kind]++
				in.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// Ran counts the faults injected, by kind.
func (in *Injector) Ran() map[FaultKind]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := map[FaultKind]int{}
	for k, v := range in.ran {
		out[k] = v
	}
	return out
}

// Changes returns the policy changes made, in order.
func (in *Injector) Changes() []PolicyChange {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]PolicyChange(nil), in.changes...)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// inject runs one fault and undoes it; it reports whether it ran.
func (in *Injector) inject(ctx context.Context, f Fault) bool {
	ri := in.agentOf(f.Region)
	switch f.Kind {
	case KillLeader, PauseLeader:
		mu := in.target("coordinators")
		mu.Lock()
		defer mu.Unlock()
		p := in.c.Leader(ctx)
		if p == nil {
			return false
		}
		if f.Kind == KillLeader {
			p.Kill()
			sleep(ctx, f.For)
			if err := p.Restart(); err != nil && in.Logf != nil {
				in.Logf("restart %s: %v", p.Name, err)
			}
		} else {
			p.Pause()
			sleep(ctx, f.For)
			p.Resume()
		}
	case KillAgent:
		mu := in.target("agent-" + f.Region)
		mu.Lock()
		defer mu.Unlock()
		a := in.c.Agents[ri]
		a.Kill()
		sleep(ctx, f.For)
		if err := a.Restart(); err != nil && in.Logf != nil {
			in.Logf("restart %s: %v", a.Name, err)
		}
	case RestartRedis, PauseRedis:
		mu := in.target("redis-" + f.Region)
		mu.Lock()
		defer mu.Unlock()
		srv := in.c.Redis[ri]
		if f.Kind == RestartRedis {
			if err := srv.Restart(); err != nil && in.Logf != nil {
				in.Logf("restart redis of %s: %v", f.Region, err)
			}
			return true
		}
		end := time.Now().Add(f.For)
		for time.Now().Before(end) && ctx.Err() == nil {
			srv.Pause()
			sleep(ctx, f.Down)
			srv.Resume()
			sleep(ctx, f.Period-f.Down)
		}
		srv.Resume()
	case FlapLatency:
		mu := in.target("redis-proxy-" + f.Region)
		mu.Lock()
		defer mu.Unlock()
		px := in.c.Agents[ri].ToRedis
		end := time.Now().Add(f.For)
		for time.Now().Before(end) && ctx.Err() == nil {
			px.SetDelay(f.Delay)
			sleep(ctx, f.Down)
			px.SetDelay(0)
			sleep(ctx, f.Period-f.Down)
		}
		px.SetDelay(0)
	case PartitionRegion:
		mu := in.target("coord-proxies-" + f.Region)
		mu.Lock()
		defer mu.Unlock()
		a := in.c.Agents[ri]
		a.Partition(true)
		sleep(ctx, f.For)
		a.Partition(false)
	case ChangeLimit, ChangeFailure:
		return in.changePolicy(ctx, f)
	default:
		return false
	}
	return true
}

// changePolicy stores the policy with a new limit or failure mode,
// retrying while no coordinator answers, and records when it was sent and
// acknowledged.
func (in *Injector) changePolicy(ctx context.Context, f Fault) bool {
	mu := in.target("policy")
	mu.Lock()
	defer mu.Unlock()
	in.mu.Lock()
	if f.Kind == ChangeLimit {
		in.limit = f.Limit
	} else {
		in.failure = in.Failures[f.Failure%len(in.Failures)]
	}
	yaml := in.Policy(in.limit, in.failure)
	in.mu.Unlock()
	ps, err := policy.ParsePolicies([]byte(yaml))
	if err != nil || len(ps) != 1 {
		return false
	}
	ch := PolicyChange{Sent: time.Now(), Policy: ps[0]}
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := in.c.Admin(cctx, func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
			_, err := a.SetPolicy(cctx, &pb.SetPolicyRequest{Yaml: yaml}, opts...)
			return err
		})
		cancel()
		if err == nil {
			ch.Acked = time.Now()
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	in.mu.Lock()
	in.changes = append(in.changes, ch) // sent, even if never acknowledged: it may have been stored
	in.mu.Unlock()
	return !ch.Acked.IsZero()
}

// agentOf is the index in Cluster.Agents of region's first agent (0 if
// none).
func (in *Injector) agentOf(region string) int {
	for i, a := range in.c.Agents {
		if a.Region == region {
			return i
		}
	}
	return 0
}
