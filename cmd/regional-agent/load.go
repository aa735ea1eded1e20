package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/admission"
	"github.com/quota-lease/quota-lease/internal/cli"
	"github.com/quota-lease/quota-lease/policy"
	"github.com/quota-lease/quota-lease/regional"
)

// loadConfig are the load command's flags.
type loadConfig struct {
	redisAddr   string
	policies    string
	duration    time.Duration
	identities  int
	workers     int
	maxRequests int64
	timeout     time.Duration
	seed        uint64
}

func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c loadConfig
	fs := cli.NewFlags("load", "Usage: regional-agent load [flags]\n\nSends traffic from many identities for every "+
		"policy in --policies through\nthe regional engine against a real Redis, then prints per policy what "+
		"was\nadmitted and whether the hottest identity stayed within its limit.\n", stderr)
	fs.StringVar(&c.redisAddr, "redis", "127.0.0.1:6379", "Redis address (host:port) of this region")
	fs.StringVar(&c.policies, "policies", "examples/policies.yaml", "policy file (YAML, one policy per document)")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "how long to send traffic")
	fs.IntVar(&c.identities, "identities", 50,
		"distinct identities per policy; the first one is hot and sends half the traffic")
	fs.IntVar(&c.workers, "workers", 8, "concurrent callers")
	fs.Int64Var(&c.maxRequests, "max-requests", 200_000, "stop after this many requests even if --duration has not passed")
	fs.DurationVar(&c.timeout, "timeout", 50*time.Millisecond, "per-check timeout")
	fs.Uint64Var(&c.seed, "seed", 1, "random seed for the traffic")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return cli.ErrUsage
	}
	if c.identities < 1 || c.workers < 1 || c.duration <= 0 || c.maxRequests < 1 {
		fmt.Fprintln(stderr, "load: --identities, --workers, --duration and --max-requests must be positive")
		return cli.ErrUsage
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "load", Output: stderr, Level: hclog.Info})

	data, err := os.ReadFile(c.policies)
	if err != nil {
		return fmt.Errorf("read policies: %w", err)
	}
	policies, err := policy.ParsePolicyFile(data)
	if err != nil {
		return fmt.Errorf("%s: %w", c.policies, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.redisAddr, MaxRetries: -1, PoolSize: c.workers + 2})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w (start one with 'make redis')", c.redisAddr, err)
	}
	eng, err := regional.NewEngine(rdb, policies, regional.DefaultConfig())
	if err != nil {
		return err
	}
	if _, err := eng.InitStore(ctx); err != nil {
		return err
	}
	log.Info("sending traffic", "redis", c.redisAddr, "policies", len(policies), "identities", c.identities,
		"duration", c.duration)
	stats := drive(ctx, eng, policies, c, log)
	report(stdout, policies, stats)
	return nil
}

// policyStats counts one policy's outcomes; perIdentity counts admissions.
type policyStats struct {
	sent, admitted, rejected, errors atomic.Int64
	mu                               sync.Mutex
	perIdentity                      map[int]int64
	elapsed                          time.Duration
}

// check decides one request of p's cost as the agent would with the
// policy's whole limit: validated by admission, decided by eng.
func check(
	ctx context.Context,
	eng *regional.Engine,
	p *policy.Policy,
	attrs map[string]string,
) (policy.Decision, error) {
	t, err := admission.Resolve(p, admission.Request{Policy: p.Name, Attributes: attrs, Cost: p.Cost}, p.Limits())
	if err != nil {
		return policy.Decision{}, err
	}
	res := eng.Decide(ctx, []*admission.Ticket{&t})[0]
	return res.Decision, res.Err
}

func drive(
	ctx context.Context,
	eng *regional.Engine,
	policies []*policy.Policy,
	c loadConfig,
	log hclog.Logger,
) []*policyStats {
	stats := make([]*policyStats, len(policies))
	for i := range stats {
		stats[i] = &policyStats{perIdentity: map[int]int64{}}
	}
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	start := time.Now()
	var total atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < c.workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(c.seed, uint64(w)))
			for ctx.Err() == nil && total.Add(1) <= c.maxRequests {
				pi := r.IntN(len(policies))
				p, st := policies[pi], stats[pi]
				id := 0 // the hot identity gets half the traffic
				if r.IntN(2) == 1 {
					id = r.IntN(c.identities)
				}
				cctx, ccancel := context.WithTimeout(ctx, c.timeout)
				d, err := check(cctx, eng, p, attributes(p, id))
				ccancel()
				st.sent.Add(1)
				switch {
				case err != nil:
					if ctx.Err() == nil {
						st.errors.Add(1)
					}
				case d.Allowed:
					st.admitted.Add(1)
					st.mu.Lock()
					st.perIdentity[id] += p.Cost
					st.mu.Unlock()
				default:
					st.rejected.Add(1)
				}
			}
		}(w)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			for _, st := range stats {
				st.elapsed = time.Since(start)
			}
			return stats
		case <-tick.C:
			log.Info("progress", "elapsed", time.Since(start).Round(time.Second), "requests", min(total.Load(), c.maxRequests))
		}
	}
}

// attributes gives identity number id a value for every attribute the
// policy counts by.
func attributes(p *policy.Policy, id int) map[string]string {
	m := make(map[string]string, len(p.Identity))
	for _, a := range p.Identity {
		m[a] = a + "-" + strconv.Itoa(id)
	}
	return m
}

// allowance is the most one identity may be admitted in elapsed time.
func allowance(p *policy.Policy, elapsed time.Duration) float64 {
	l := p.Limits()
	switch l.Algorithm {
	case policy.TokenBucket:
		return (float64(l.Capacity) + float64(l.Rate)*elapsed.Seconds()) / float64(policy.Micro)
	case policy.FixedWindow, policy.SlidingWindow:
		// a window boundary inside the run lets two windows' worth through
		windows := float64(elapsed.Milliseconds()/l.WindowMs + 2)
		return windows * float64(l.Capacity) / float64(policy.Micro)
	default:
		windows := float64(elapsed.Milliseconds()/l.WindowMs + 1)
		return windows * float64(l.Capacity) / float64(policy.Micro)
	}
}

func report(w io.Writer, policies []*policy.Policy, stats []*policyStats) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\talgorithm\tsent\tadmitted\trejected\terrors\thot identity admitted\tat most\t")
	for i, p := range policies {
		st := stats[i]
		ids := make([]int, 0, len(st.perIdentity))
		for id := range st.perIdentity {
			ids = append(ids, id)
		}
		sort.Ints(ids)
		hot := st.perIdentity[0]
		verdict := "ok"
		if float64(hot) > allowance(p, st.elapsed) {
			verdict = "OVER"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%.0f %s\t\n", p.Name, p.Algorithm, st.sent.Load(), st.admitted.Load(),
			st.rejected.Load(), st.errors.Load(), hot, allowance(p, st.elapsed), verdict)
	}
	tw.Flush()
}
