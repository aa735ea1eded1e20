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
}

// Admission is one admitted request, as the client saw it.
type Admission struct {
	At       time.Time
	Region   string
	Policy   string
	Identity string
	Mode     string
	// Took is how long the check took: the system decided it somewhere
	// between At and At+Took.
	Took time.Duration
}

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
	var wg sync.WaitGroup
	for li, l := range loads {
		for ai, a := range d.c.Agents {
			wg.Add(1)
			go func(seed uint64, l Load, a *AgentProcess) {
				defer wg.Done()
				d.loop(ctx, start, rand.New(rand.NewPCG(seed, 7)), l, a)
			}(uint64(li*100+ai+1), l, a)
		}
	}
	wg.Wait()
}

func (d *Driver) loop(ctx context.Context, start time.Time, r *rand.Rand, l Load, a *AgentProcess) {
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
		// A generous deadline: a check that never answers is a failure, a slow
		// one on a loaded machine is not (tests assert no wall-clock speed;
		// Describe reports the slowest).
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		sent := time.Now()
		resp, err := a.Check.Check(cctx, &pb.CheckRequest{Policy: l.Policy, Attributes: map[string]string{l.Attribute: identity}})
		cancel()
		d.record(l.Policy, a.Region, identity, sent, time.Since(sent), resp, err, ending(ctx))
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

func (d *Driver) record(policy, region, identity string, at time.Time, took time.Duration, resp *pb.CheckResponse, err error, ending bool) {
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
	case resp.Allowed:
		st.Admitted++
		st.Modes[resp.Mode]++
		d.admissions = append(d.admissions, Admission{At: at, Region: region, Policy: policy, Identity: identity, Mode: resp.Mode, Took: took})
	default:
		st.Rejected++
		st.Modes[resp.Mode]++
	}
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

// MaxWindow returns, for policy, the most admitted for one identity across
// all regions in any window of length w, with the identity and when.
func (d *Driver) MaxWindow(policy string, w time.Duration) (max int, identity string, at time.Time) {
	forEachWindow(d.Admissions(), policy, w, func(id string, end time.Time, n int) error {
		if n > max {
			max, identity, at = n, id, end
		}
		return nil
	})
	return max, identity, at
}

// forEachWindow calls fn for every window of length w that ends at an
// admission of policy: per identity (in name order), the admissions in
// (end-w, end] by the client's send times. It stops at fn's first error.
func forEachWindow(adm []Admission, policy string, w time.Duration, fn func(identity string, end time.Time, count int) error) error {
	byID := map[string][]time.Time{}
	for _, a := range adm {
		if a.Policy == policy {
			byID[a.Identity] = append(byID[a.Identity], a.At)
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		ts := byID[id]
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		lo := 0
		for hi, end := range ts {
			for end.Sub(ts[lo]) >= w {
				lo++
			}
			if err := fn(id, end, hi-lo+1); err != nil {
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
