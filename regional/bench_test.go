package regional

import (
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/redistest"
	"github.com/quota-lease/quota-lease/policy"
)

// generous is a policy under which most checks admit.
const generous = "name: api\nidentity: [tenant]\nlimit: 1000000\nperiod: 1s\n"

// benchEngine is an engine on a fresh real Redis, using the Redis clock as
// in production, under the policies of policyYAML, and its client.
func benchEngine(b *testing.B, policyYAML string) (*Engine, *redis.Client) {
	srv := redistest.Start(b)
	ps := testenv.MustPolicies(b, policyYAML)
	rdb := srv.Client(b)
	return newEngine(b, rdb, ps, Config{}), rdb
}

func tenants(n int) []map[string]string {
	out := make([]map[string]string, n)
	for i := range out {
		out[i] = map[string]string{"tenant": "t" + strconv.Itoa(i)}
	}
	return out
}

// BenchmarkCheck is one decision per round trip, one caller.
func BenchmarkCheck(b *testing.B) {
	eng, _ := benchEngine(b, generous)
	ts := tenants(1000)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := eng.Check(b.Context(), Request{Policy: "api", Attributes: ts[i%len(ts)], Cost: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckParallel is one decision per round trip, GOMAXPROCS*4
// concurrent callers sharing the connection pool.
func BenchmarkCheckParallel(b *testing.B) {
	eng, _ := benchEngine(b, generous)
	ts := tenants(1000)
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if _, err := eng.Check(b.Context(), Request{Policy: "api", Attributes: ts[i%len(ts)], Cost: 1}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCheckBatch is 16 decisions per round trip, with the script (a
// token bucket) and with a fixed window's counters; ns/op is per batch,
// decisions/s is reported separately.
func BenchmarkCheckBatch(b *testing.B) {
	const size = 16
	for _, alg := range []string{"token_bucket", "fixed_window"} {
		b.Run(alg, func(b *testing.B) {
			eng, _ := benchEngine(b, generous+"algorithm: "+alg+"\n")
			ts := tenants(1000)
			reqs := make([]Request, size)
			n := 0
			for i := 0; b.Loop(); i++ {
				for j := range reqs {
					reqs[j] = Request{Policy: "api", Attributes: ts[(i*size+j)%len(ts)], Cost: 1}
				}
				for _, r := range eng.CheckBatch(b.Context(), reqs) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				n += size
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkApply is the pure transition, the simulator's inner loop.
func BenchmarkApply(b *testing.B) {
	l := policy.Limits{Algorithm: policy.TokenBucket, Capacity: 20 * policy.Micro, Rate: 5 * policy.Micro}
	var s policy.State
	for i := int64(0); b.Loop(); i++ {
		s, _, _ = policy.Apply(s, l, i, policy.Micro)
	}
}

// BenchmarkScriptServerTime is the time Redis spends in the decision
// script (INFO commandstats: usec per EVALSHA), the part of a decision no
// client-side work can remove, for each algorithm with one decision per
// script call (a lone check) and 16 (a batch, or concurrent checks sharing
// a call). Reported as server-µs/decision.
func BenchmarkScriptServerTime(b *testing.B) {
	for _, alg := range []string{"token_bucket", "fixed_window", "sliding_window", "sliding_log"} {
		for _, per := range []int{1, 16} {
			b.Run(alg+"/"+strconv.Itoa(per)+"-per-call", func(b *testing.B) {
				eng, rdb := benchEngine(b, "name: api\nidentity: [tenant]\nalgorithm: "+alg+"\nlimit: 5000\nperiod: 1s\n")
				ts := tenants(1000)
				reqs := make([]Request, per)
				check := func(i int) {
					for j := range reqs {
						reqs[j] = Request{Policy: "api", Attributes: ts[(i*per+j)%len(ts)], Cost: 1}
					}
					for _, r := range eng.CheckBatch(b.Context(), reqs) {
						if r.Err != nil {
							b.Fatal(r.Err)
						}
					}
				}
				for i := 0; i*per < len(ts); i++ { // every key exists: the steady state
					check(i)
				}
				if err := rdb.ConfigResetStat(b.Context()).Err(); err != nil {
					b.Fatal(err)
				}
				for i := 0; b.Loop(); i++ {
					check(i)
				}
				info := rdb.Info(b.Context(), "commandstats").Val()
				calls, usec := commandStat(info, "evalsha")
				if calls == 0 {
					b.Fatalf("no EVALSHA in INFO commandstats:\n%s", info)
				}
				b.ReportMetric(usec/calls/float64(per), "server-µs/decision")
			})
		}
	}
}

// commandStat reads calls and usec of cmd from INFO commandstats.
func commandStat(info, cmd string) (calls, usec float64) {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				calls = f
			case "usec":
				usec = f
			}
		}
	}
	return calls, usec
}

// BenchmarkSlidingLogRejection rejects a check against a full sliding log
// of 10,000 entries (the most a policy may keep) and reports the server
// time per rejection: its retry delay reads the log oldest first only as
// far as it needs to.
func BenchmarkSlidingLogRejection(b *testing.B) {
	eng, rdb := benchEngine(b, "name: sl\nidentity: [tenant]\nalgorithm: sliding_log\nlimit: 10000\nperiod: 1h\n")
	reqs := make([]Request, maxScriptDecisions)
	for i := range reqs {
		reqs[i] = Request{Policy: "sl", Attributes: map[string]string{"tenant": "full"}, Cost: 1}
	}
	for filled := 0; filled < 10_000; filled += len(reqs) {
		for _, r := range eng.CheckBatch(b.Context(), reqs[:min(len(reqs), 10_000-filled)]) {
			if r.Err != nil || !r.Decision.Allowed {
				b.Fatalf("filling the log: %+v", r)
			}
		}
	}
	if err := rdb.ConfigResetStat(b.Context()).Err(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if d, err := eng.Check(b.Context(), reqs[0]); err != nil || d.Allowed || d.RetryAfterMs <= 0 {
			b.Fatalf("check against a full log: %+v %v, want a rejection with a retry", d, err)
		}
	}
	calls, usec := commandStat(rdb.Info(b.Context(), "commandstats").Val(), "evalsha")
	b.ReportMetric(usec/calls, "server-µs/rejection")
}
