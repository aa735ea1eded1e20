package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Load describes traffic for one policy: how many requests per second
// each region sends at each moment, from how many identities, with what
// share for the hottest.
type Load struct {
	Policy string
	// Attribute is the identity attribute the policy counts by.
	Attribute string
	// Identities and Hot: identity 0 sends Hot of the traffic, the others
	// share the rest evenly. One identity means a single shared quota.
	Identities int
	Hot        float64
	// Rate returns region's requests per second at elapsed.
	Rate func(region string, elapsed time.Duration) float64
	// Identity, when set, names the identity of every request region sends
	// at elapsed instead (tenants with a home), Identities and Hot unused.
	Identity func(region string, elapsed time.Duration) string
	// Conversations, when set, makes every request one whose cost is
	// charged when it ends, to a post_hoc policy.
	Conversations *Conversations
}

// Conversations are requests as an AI gateway sends them: a check (cost
// 0) when the request starts and, if admitted, a charge of its cost, 1 to
// MaxCost units, when it ends, Think later (uniform in [Think/4, Think]),
// to the same agent. The charge is counted whatever its answer, so it is
// recorded as an admission of its cost. At most MaxInFlight requests of
// the load are checked and not yet charged, across all regions: an
// arrival beyond them is turned away before its check, as the gateway's
// concurrency limit would (the policy's max_in_flight).
type Conversations struct {
	MaxCost     int64
	MaxInFlight int
	Think       time.Duration
}

// Admission is one admitted request, as the client saw it: a check of
// cost 1, or a charge after the fact of its cost.
type Admission struct {
	At       time.Time
	Region   string
	Policy   string
	Identity string
	Mode     string
	// Took is how long the check took: the system decided it somewhere
	// between At and At+Took.
	Took time.Duration
	// Cost is the units it took: 0 means 1.
	Cost int64
}

// units is what a counts for: its cost.
func (a Admission) units() int64 { return max(1, a.Cost) }

// Stats counts one region's outcomes for one policy.
type Stats struct {
	Sent, Admitted, Rejected, Errors int64
	Modes                            map[string]int64
	// LastError is the most recent failed check's error.
	LastError string
	// MaxLatency is the slowest check; Slow counts checks over 200 ms.
	MaxLatency time.Duration
	Slow       int64
}

// Driver sends the loads to the cluster's agents over gRPC and records
// every admission, independently of the system under test.
type Driver struct {
	c *Cluster

	mu         sync.Mutex
	admissions []Admission
	stats      map[string]*Stats // policy/region
	start      time.Time
}

// NewDriver returns a driver for c.
func NewDriver(c *Cluster) *Driver { return &Driver{c: c, stats: map[string]*Stats{}} }

// Run sends the loads until ctx ends or d passes. Every loop is bounded by
// time, and each region's sending rate by its Rate.
func (d *Driver) Run(ctx context.Context, dur time.Duration, loads ...Load) {
	ctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	d.mu.Lock()
	if d.start.IsZero() {
		d.start = time.Now()
	}
	start := d.start
	d.mu.Unlock()
	var wg, charges sync.WaitGroup
	for li, l := range loads {
		var flight chan struct{}
		if l.Conversations != nil {
			flight = make(chan struct{}, l.Conversations.MaxInFlight)
		}
		for ai, a := range d.c.Agents {
			wg.Add(1)
			go func(seed uint64, l Load, a *AgentProcess) {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, 7))
				d.loop(ctx, start, r, l, a, func(identity string) {
					if flight != nil {
						d.converse(ctx, r, l, a, identity, flight, &charges)
						return
					}
					d.check(ctx, l.Policy, a, &pb.CheckRequest{Policy: l.Policy, Attributes: map[string]string{l.Attribute: identity}})
				})
			}(uint64(li*100+ai+1), l, a)
		}
	}
	wg.Wait()
	charges.Wait() // every admitted conversation is charged, also past the end
}

// check sends one request to a and records its answer.
func (d *Driver) check(ctx context.Context, pol string, a *AgentProcess, req *pb.CheckRequest) *pb.CheckResponse {
	// A generous deadline: a check that never answers is a failure, a slow
	// one on a loaded machine is not (tests assert no wall-clock speed;
	// Describe reports the slowest).
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	sent := time.Now()
	resp, err := a.Check.Check(cctx, req)
	cancel()
	d.record(pol, a.Region, req, sent, time.Since(sent), resp, err, ending(ctx))
	return resp
}

// converse starts one conversation of l at a: a check, and if admitted a
// charge in the background, holding a place in flight until then.
func (d *Driver) converse(
	ctx context.Context,
	r *rand.Rand,
	l Load,
	a *AgentProcess,
	identity string,
	flight chan struct{},
	charges *sync.WaitGroup,
) {
	select {
	case flight <- struct{}{}:
	default:
		return // the gateway turns it away
	}
	attrs := map[string]string{l.Attribute: identity}
	resp := d.check(ctx, l.Policy, a, &pb.CheckRequest{Policy: l.Policy, Attributes: attrs, Check: true})
	if resp == nil || !resp.Allowed {
		<-flight
		return
	}
	c := l.Conversations
	think := c.Think/4 + time.Duration(r.Int64N(int64(c.Think-c.Think/4)+1))
	cost := 1 + r.Int64N(c.MaxCost)
	charges.Go(func() {
		defer func() { <-flight }()
		time.Sleep(think) // bounded: the request runs, then ends
		// Not the run's context: an admitted request is charged when it
		// ends, also after the run; a failed charge is an error.
		d.check(context.WithoutCancel(ctx), l.Policy, a, &pb.CheckRequest{Policy: l.Policy, Attributes: attrs, Cost: cost})
	})
}

func (d *Driver) loop(
	ctx context.Context,
	start time.Time,
	r *rand.Rand,
	l Load,
	a *AgentProcess,
	send func(identity string),
) {
	next := time.Now()
	for ctx.Err() == nil {
		rate := l.Rate(a.Region, time.Since(start))
		if rate <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			next = time.Now()
			continue
		}
		next = next.Add(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
		if w := time.Until(next); w > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(w):
			}
		}
		id := 0
		if l.Identities > 1 && r.Float64() >= l.Hot {
			id = 1 + r.IntN(l.Identities-1)
		}
		identity := "id-" + strconv.Itoa(id)
		if l.Identity != nil {
			identity = l.Identity(a.Region, time.Since(start))
		}
		send(identity)
	}
}

// ending reports whether the run is over: its context is done, or its
// deadline has passed by the clock (gRPC compares the deadline with the
// clock itself, a moment before the context's timer marks it done).
func ending(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// record counts req's answer: an admission when admitted, and a charge
// after the fact (a cost with no check) whatever its answer, since it is
// counted all the same; a check (cost 0) admits nothing to count.
func (d *Driver) record(
	policy, region string,
	req *pb.CheckRequest,
	at time.Time,
	took time.Duration,
	resp *pb.CheckResponse,
	err error,
	ending bool,
) {
	identity := req.Attributes[firstKey(req.Attributes)]
	d.mu.Lock()
	defer d.mu.Unlock()
	key := policy + "/" + region
	st := d.stats[key]
	if st == nil {
		st = &Stats{Modes: map[string]int64{}}
		d.stats[key] = st
	}
	st.Sent++
	st.MaxLatency = max(st.MaxLatency, took)
	if took > 200*time.Millisecond {
		st.Slow++
	}
	switch {
	case err != nil:
		if !ending {
			st.Errors++
			st.LastError = err.Error()
		}
	case req.Check && resp.Allowed:
		st.Admitted++
		st.Modes[resp.Mode]++
	case resp.Allowed || req.Cost > 0:
		if resp.Allowed {
			st.Admitted++
		} else {
			st.Rejected++
		}
		st.Modes[resp.Mode]++
		d.admissions = append(d.admissions, Admission{
			At:       at,
			Region:   region,
			Policy:   policy,
			Identity: identity,
			Mode:     resp.Mode,
			Took:     took,
			Cost:     req.Cost,
		})
	default:
		st.Rejected++
		st.Modes[resp.Mode]++
	}
}

// firstKey is the one attribute the driver's requests carry.
func firstKey(m map[string]string) string {
	for k := range m {
		return k
	}
	return ""
}

// Admissions returns a copy of every admission recorded so far.
func (d *Driver) Admissions() []Admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Admission(nil), d.admissions...)
}

// Stats returns a copy of policy's per-region counts.
func (d *Driver) Stats(policy string) map[string]Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]Stats{}
	for _, a := range d.c.Agents {
		if st := d.stats[policy+"/"+a.Region]; st != nil {
			cp := *st
			cp.Modes = map[string]int64{}
			for k, v := range st.Modes {
				cp.Modes[k] = v
			}
			out[a.Region] = cp
		}
	}
	return out
}

// forEachWindow calls fn for every window of length w that ends at an
// admission of policy: per identity (in name order), the admissions in
// (end-w, end] by the client's send times, in units (Admission.Cost). It
// stops at fn's first error.
func forEachWindow(
	adm []Admission,
	policy string,
	w time.Duration,
	fn func(identity string, end time.Time, count int) error,
) error {
	byID := map[string][]Admission{}
	for _, a := range adm {
		if a.Policy == policy {
			byID[a.Identity] = append(byID[a.Identity], a)
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		as := byID[id]
		sort.SliceStable(as, func(i, j int) bool { return as[i].At.Before(as[j].At) })
		lo, units := 0, int64(0)
		for _, a := range as {
			units += a.units()
			for a.At.Sub(as[lo].At) >= w {
				units -= as[lo].units()
				lo++
			}
			if err := fn(id, a.At, int(units)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Describe formats a region's stats.
func (s Stats) Describe() string {
	return fmt.Sprintf("sent %d admitted %d rejected %d errors %d (last: %q) modes %v, slowest %v, %d over 200ms",
		s.Sent, s.Admitted, s.Rejected, s.Errors, s.LastError, s.Modes, s.MaxLatency.Round(time.Millisecond), s.Slow)
}
