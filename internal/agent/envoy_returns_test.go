package agent

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// The configurations the returns tests load: envoyproxy/ratelimit files
// with quota-lease's returns on some limits, and a policy of its own.
const (
	returnsConfig = `domain: conc
scope: region
descriptors:
  - key: user
    returns: true
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: gone
    rate_limit: {unlimited: true}
`
	racersConfig = `domain: race
scope: region
algorithm: sliding_log
descriptors:
  - key: user
    returns: true
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: team
    returns: true
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 5}
`
	plainPolicy = "name: plain\nidentity: [user]\nlimit: 10\nperiod: 1h\nscope: region\n"
)

// hits is a descriptor of entries kv with its own hits_addend, returning
// them when ret.
func hits(n uint64, ret bool, kv ...string) *commonrl.RateLimitDescriptor {
	e := withHits(entries(kv...), n)
	e.IsNegativeHits = ret
	return e
}

// Returned hits (is_negative_hits) through a real gRPC client against an
// agent on a real Redis: what they free, what they are refused, and that
// N racers who take and return never hold more than the limit, refused
// requests returning too, as Envoy's do.
func TestEnvoyReturns(t *testing.T) {
	k := policyCoordinator(t, returnsConfig, racersConfig, plainPolicy)
	ra := startAgent(t, "us", startRedis(t).Addr, []string{k.addr}, func(c *Config) { c.EnvoyExactCounts = true })
	client := rlsv3.NewRateLimitServiceClient(grpcConn(t, ra.grpcAddr))
	one := func(t *testing.T, domain string, d *commonrl.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		return shouldRateLimit(t, client, domain, d).Statuses[0]
	}
	returned := func(result string) float64 {
		return counterValueLabeled(t, ra.a, "quotalease_agent_returned_units_total", "result", result)
	}

	// inOneSecond runs steps, which must fall in one window of a second,
	// until they do, each attempt on a user of its own.
	inOneSecond := func(t *testing.T, name string, steps func(user string)) {
		t.Helper()
		for attempt := range 5 {
			user := name + "-" + string(rune('a'+attempt))
			testenv.WaitFor(t, 2*time.Second, "the start of a second", func() bool { return time.Now().UnixMilli()%1000 < 300 })
			w := time.Now().Unix()
			steps(user)
			if time.Now().Unix() == w {
				return
			}
		}
		t.Fatal("five attempts straddled a window boundary")
	}

	t.Run("returns bring the count back, never above what was taken", func(t *testing.T) {
		// A fixed window of 3 per second. Requests return at their end
		// whether or not they were admitted, as Envoy's do: the refused
		// one's return frees nothing.
		var got []*rlsv3.RateLimitResponse_DescriptorStatus
		var freed, cleared, unmatched float64
		inOneSecond(t, "count", func(user string) {
			got, freed, cleared, unmatched = nil, returned("freed"), returned("cleared"), returned("unmatched")
			for _, n := range []int64{1, 1, 1, 1, -1, -1, 1, -5, -2, 1, 1, 1, 1} { // take, or return -n
				got = append(got, one(t, "conc", hits(uint64(max(n, -n)), n < 0, "user", user)))
			}
			freed, cleared, unmatched = returned("freed")-freed, returned("cleared")-cleared, returned("unmatched")-unmatched
		})
		want := []struct {
			code rlsv3.RateLimitResponse_Code
			left uint32
		}{{ok, 2}, {ok, 1}, {ok, 0}, {over, 0}, {ok, 0}, {ok, 1}, {ok, 0}, {ok, 3}, {ok, 3}, {ok, 2}, {ok, 1}, {ok, 0}, {over, 0}}
		for i, w := range want {
			if got[i].Code != w.code || got[i].LimitRemaining != w.left || got[i].CurrentLimit.GetRequestsPerUnit() != 3 {
				t.Fatalf("step %d: %v, want %s with %d remaining of 3", i, got[i], w.code, w.left)
			}
		}
		// Returning 5 with 3 held frees 3; returning 2 with none held
		// frees nothing; so 3 are admitted after, no more.
		if freed != 4 || cleared != 1 || unmatched != 4 {
			t.Fatalf("returned units: freed %v, cleared %v, unmatched %v; want 4, 1 and 4", freed, cleared, unmatched)
		}
	})

	t.Run("a return frees nothing in a window that did not charge it", func(t *testing.T) {
		// 3 taken in one second's window, then in the next: 1 taken, and
		// returns of 3 and 1, all within that next window.
		var late, own *rlsv3.RateLimitResponse_DescriptorStatus
		for attempt := 0; ; attempt++ {
			if attempt == 5 {
				t.Fatal("five attempts straddled a window boundary")
			}
			user := "late-" + string(rune('a'+attempt))
			testenv.WaitFor(t, 2*time.Second, "the start of a second", func() bool { return time.Now().UnixMilli()%1000 < 300 })
			w := time.Now().Unix()
			for range 3 {
				one(t, "conc", hits(1, false, "user", user))
			}
			if time.Now().Unix() != w {
				continue
			}
			testenv.WaitFor(t, 2*time.Second, "the next window", func() bool { return time.Now().Unix() > w })
			one(t, "conc", hits(1, false, "user", user)) // the new window's one
			// The 3 held from the last window are returned first: they
			// free nothing here; the fourth return frees this window's.
			late = one(t, "conc", hits(3, true, "user", user))
			own = one(t, "conc", hits(1, true, "user", user))
			if time.Now().Unix() == w+1 {
				break
			}
		}
		if late.LimitRemaining != 2 || own.LimitRemaining != 3 {
			t.Fatalf("returns after the window rolled: %d then %d remaining, want 2 then 3", late.LimitRemaining, own.LimitRemaining)
		}
	})

	t.Run("refused returns change nothing", func(t *testing.T) {
		// Sliding logs of a day: nothing leaves them during the test.
		one(t, "race", hits(2, false, "team", "bad"))
		one(t, "race", hits(1, false, "path", "p"))
		for _, c := range []struct {
			name   string
			domain string
			ds     []*commonrl.RateLimitDescriptor
			code   codes.Code
			want   string
		}{
			{"to a rate limit", "race", d(hits(1, false, "team", "bad"), hits(1, true, "path", "p")), codes.InvalidArgument, "does not accept returns"},
			{"with a limit override", "race", d(withOverride(hits(1, true, "team", "bad"), 9, typev3.RateLimitUnit_SECOND)), codes.InvalidArgument, "no limit of its own"},
			{"to a policy named by generic_key", "elsewhere", d(hits(1, true, "generic_key", "plain", "user", "bad")), codes.InvalidArgument, "does not accept returns"},
			{"in no domain", "", d(hits(1, true, "team", "bad")), codes.Unknown, "domain must not be empty"},
		} {
			wantRefused(t, client, c.name, c.code, c.want, c.domain, c.ds...)
		}
		// Answered, matching nothing: more hits than a return may carry,
		// an unlimited descriptor, a descriptor no limit matches.
		resp := shouldRateLimit(t, client, "conc",
			hits(math.MaxUint64, true, "user", "bad"), hits(1, true, "gone", "x"), hits(1, true, "nomatch", "x"))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != math.MaxUint32 || resp.Statuses[2].CurrentLimit != nil {
			t.Fatalf("unmatched returns: %v, want OK, no limits", resp)
		}
		if st := one(t, "race", hits(math.MaxUint64, true, "team", "bad")); st.Code != ok || st.CurrentLimit != nil {
			t.Fatalf("a return of more hits than any limit holds: %v, want OK with no limit", st)
		}
		// Nothing was charged or returned: team "bad" still holds 2 of 3,
		// path "p" 1 of 5.
		if st := one(t, "race", hits(1, false, "path", "p")); st.LimitRemaining != 3 {
			t.Fatalf("path after the refused calls: %v, want 3 remaining", st)
		}
		if st := one(t, "race", hits(1, false, "team", "bad")); st.Code != ok || st.LimitRemaining != 0 {
			t.Fatalf("team after the refused calls: %v, want the last of 3", st)
		}
	})

	t.Run("racers never hold more than the limit", func(t *testing.T) {
		const racers, rounds, limit = 16, 12, 5
		var held, most, admitted atomic.Int64
		var wg sync.WaitGroup
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					resp, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "race", Descriptors: d(hits(1, false, "user", "u"))})
					if err != nil {
						t.Errorf("take: %v", err)
						return
					}
					if resp.OverallCode == ok {
						admitted.Add(1)
						for h := held.Add(1); ; {
							m := most.Load()
							if h <= m || most.CompareAndSwap(m, h) {
								break
							}
						}
						time.Sleep(time.Millisecond) // the request's work, while it holds
						held.Add(-1)                 // released before the return is sent
					}
					// Every request returns at its end, admitted or not,
					// as Envoy's do.
					if _, err := client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "race", Descriptors: d(hits(1, true, "user", "u"))}); err != nil {
						t.Errorf("return: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if most.Load() > limit {
			t.Fatalf("%d held at once by the racers' own count, limit %d", most.Load(), limit)
		}
		if admitted.Load() <= limit {
			t.Fatalf("%d admitted in all: the returns freed nothing", admitted.Load())
		}
		if st := one(t, "race", hits(1, true, "user", "u")); st.LimitRemaining != limit {
			t.Fatalf("after every holder returned: %v, want all %d back", st, limit)
		}
	})
}
