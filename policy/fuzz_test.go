package policy

import (
	"errors"
	"math"
	"testing"
)

// times turns fuzz bytes into a schedule of (time, cost) steps that moves
// mostly forward, sometimes far forward and sometimes backward.
func schedule(script []byte, maxCost int64) (nows, costs []int64) {
	now := int64(1 << 30)
	for i := 0; i+2 < len(script) && len(nows) < 200; i += 3 {
		amount := int64(script[i+1])<<8 | int64(script[i+2])
		switch script[i] % 8 {
		case 0:
			now -= amount // clock steps back
		case 1:
			now += amount * 1000
		default:
			now += amount % 500
		}
		now = min(max(now, 0), MaxTimeMs)
		nows = append(nows, now)
		costs = append(costs, int64(script[i])%maxCost+1)
	}
	return nows, costs
}

// admissions runs the schedule script makes on an empty State under limits
// l: the part the algorithms' fuzz tests share. It reports false when l is
// invalid, failing t first if Apply accepts it anyway. A step Apply refuses
// is skipped when its cost is over the capacity, and fails t otherwise;
// check sees every other step (its index, the state before and after it,
// its decision). It returns the effective time and cost of each admission.
func admissions(t testing.TB, l Limits, script []byte, check func(i int, s, ns State, d Decision)) (
	at, admitted []int64, ok bool) {
	t.Helper()
	if l.Validate() != nil {
		if _, _, err := Apply(State{}, l, 0, 1); err == nil {
			t.Fatalf("invalid limits %+v accepted", l)
		}
		return nil, nil, false
	}
	nows, costs := schedule(script, max(1, l.Capacity/Micro))
	var s State
	for i, now := range nows {
		cost := costs[i] * Micro
		ns, d, err := Apply(s, l, now, cost)
		if err != nil {
			if cost > l.Capacity {
				continue
			}
			t.Fatalf("step %d: %v", i, err)
		}
		check(i, s, ns, d)
		if d.Allowed {
			at = append(at, ns.LastMs)
			admitted = append(admitted, cost)
		}
		s = ns
	}
	return at, admitted, true
}

// FuzzTokenBucket checks the token bucket's invariants on any schedule:
// tokens stay in [0, capacity], and the admitted total over any interval of
// enforcement time is at most burst + rate*interval.
func FuzzTokenBucket(f *testing.F) {
	f.Add(int64(20*Micro), int64(5*Micro), []byte{2, 0, 100, 3, 1, 44, 0, 0, 200, 1, 0, 3})
	f.Add(int64(7_333_333), int64(1_666_666), []byte{5, 0, 1, 5, 0, 1, 5, 0, 1, 0, 1, 0, 5, 0, 1})
	f.Fuzz(func(t *testing.T, capacity, rate int64, script []byte) {
		l := Limits{Algorithm: TokenBucket, Capacity: capacity, Rate: rate}
		at, admitted, ok := admissions(t, l, script, func(i int, s, ns State, d Decision) {
			if ns.Tokens < 0 || ns.Tokens > capacity || d.Remaining != ns.Tokens {
				t.Fatalf("step %d: tokens %d outside [0, %d]", i, ns.Tokens, capacity)
			}
			if ns.LastMs < s.LastMs {
				t.Fatalf("step %d: time went back from %d to %d", i, s.LastMs, ns.LastMs)
			}
			if d.Allowed == (d.RetryAfterMs > 0) {
				t.Fatalf("step %d: allowed=%v with retry %d", i, d.Allowed, d.RetryAfterMs)
			}
		})
		if !ok {
			return
		}
		for i := range at {
			var sum int64
			for j := i; j < len(at); j++ {
				sum += admitted[j]
				dt := at[j] - at[i]
				if dt >= math.MaxInt64/rate {
					break // the allowance is beyond anything admitted
				}
				if allow := capacity + dt*rate/1000; sum > allow {
					t.Fatalf("admitted %d micro-units in %d ms, more than burst+rate*t = %d", sum, dt, allow)
				}
			}
		}
	})
}

// FuzzWindows checks the window algorithms: remaining never negative, a
// fixed window never over its limit, and a sliding log never over its limit
// in any window-length interval.
func FuzzWindows(f *testing.F) {
	f.Add(uint8(0), int64(10*Micro), int64(1000), []byte{2, 0, 100, 3, 1, 44, 0, 0, 200, 1, 0, 3})
	f.Add(uint8(1), int64(10*Micro), int64(700), []byte{2, 0, 100, 3, 1, 44, 0, 0, 200, 1, 0, 3})
	f.Add(uint8(2), int64(5*Micro), int64(300), []byte{7, 0, 9, 7, 0, 9, 7, 0, 9, 7, 0, 9})
	algs := []Algorithm{FixedWindow, SlidingWindow, SlidingLog}
	f.Fuzz(func(t *testing.T, which uint8, capacity, window int64, script []byte) {
		l := Limits{Algorithm: algs[int(which)%len(algs)], Capacity: capacity, WindowMs: window}
		at, admitted, ok := admissions(t, l, script, func(i int, _, ns State, d Decision) {
			if d.Remaining < 0 || d.RetryAfterMs < 0 || (d.Allowed == (d.RetryAfterMs > 0)) {
				t.Fatalf("step %d: bad decision %+v", i, d)
			}
			if ns.Count > capacity || ns.Sum > capacity {
				t.Fatalf("step %d: usage over limit: %+v", i, ns)
			}
		})
		if !ok {
			return
		}
		for i := range at {
			var sum int64
			for j := i; j < len(at); j++ {
				inWindow := at[j]-at[i] < window
				if l.Algorithm == FixedWindow {
					inWindow = at[j]/window == at[i]/window
				}
				if l.Algorithm == SlidingWindow {
					inWindow = false // its estimate is approximate by design
				}
				if !inWindow {
					break
				}
				if sum += admitted[j]; sum > capacity {
					t.Fatalf("%s admitted %d micro-units within one window, limit %d", l.Algorithm, sum, capacity)
				}
			}
		}
	})
}

// FuzzParsePolicies: any input yields policies that validate, or an error;
// never a panic.
func FuzzParsePolicies(f *testing.F) {
	f.Add([]byte("name: api\nidentity: [tenant]\nlimit: 10\nperiod: 1s\n"))
	f.Add([]byte("name: w\nidentity: [ip]\nalgorithm: sliding_log\nlimit: 5\nperiod: 1m\nfailure: {mode: fail-open, open_fraction: 0.5}\n"))
	f.Add([]byte("name: x\nidentity: [a, b]\nlimit: .nan\nperiod: 60\n---\nname: x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := ParsePolicies(data)
		if err != nil {
			return
		}
		for _, p := range ps {
			if err := p.Validate(); err != nil {
				t.Fatalf("parsed policy does not validate: %v", err)
			}
			if err := p.Limits().Validate(); err != nil {
				t.Fatalf("parsed policy has invalid limits: %v", err)
			}
		}
	})
}

// FuzzParseEnvoyConfig: any input is refused with ErrInvalidPolicy or
// gives policies that validate, each with an Envoy match in its domain.
func FuzzParseEnvoyConfig(f *testing.F) {
	f.Add([]byte(envoyMongo))
	f.Add([]byte(envoyMessaging))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: A B\n    value: \"{}\"\n    rate_limit: {unit: Year, requests_per_unit: 4294967295, replaces: [{name: x}]}\n"))
	f.Add([]byte("domain: q\ndescriptors:\n  - key: user\n    quota_mode: true\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: org\n    quota_mode: yes\n"))
	f.Add([]byte("domain: q\ndescriptors:\n  - key: user\n    quota_mode: 1\n    rate_limit: {unlimited: true}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := ParseEnvoyConfig(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("error %v does not wrap ErrInvalidPolicy", err)
			}
			return
		}
		for _, p := range ps {
			if err := p.Validate(); err != nil || p.Envoy == nil || p.Envoy.Domain == "" {
				t.Fatalf("parsed policy %+v: %v", p, err)
			}
		}
	})
}
