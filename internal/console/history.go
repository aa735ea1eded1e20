package console

import (
	"math"
	"slices"
	"time"

	"github.com/quota-lease/quota-lease/lease"
)

// Observation is one region's lease on one quota at a sample.
type Observation struct {
	Quota, Region string
	// Share is what the region may be enforcing, as a fraction of the
	// quota (the regions' shares sum to at most 1, except fail-open).
	Share float64
	State lease.State
}

// History keeps the samples of the last Keep, and when each region's
// lease on each quota entered its current state. It does no I/O and is
// not safe for concurrent use: the Console guards it.
type History struct {
	keep   time.Duration
	rounds []round
	since  map[[2]string]run // quota, region -> current run of one state
}

// round is one sample of every quota.
type round struct {
	at     time.Time
	quotas map[string][]point
}

type point struct {
	region string
	share  float32
	state  lease.State
}

type run struct {
	state lease.State
	since time.Time
	// seen is the sample that last saw the region, to drop vanished ones.
	seen time.Time
}

// NewHistory returns an empty history keeping keep.
func NewHistory(keep time.Duration) *History {
	return &History{keep: keep, since: map[[2]string]run{}}
}

// Record adds the sample taken at at and drops samples older than Keep.
func (h *History) Record(at time.Time, obs []Observation) {
	r := round{at: at, quotas: map[string][]point{}}
	for _, o := range obs {
		r.quotas[o.Quota] = append(r.quotas[o.Quota], point{region: o.Region, share: float32(o.Share), state: o.State})
		k := [2]string{o.Quota, o.Region}
		cur, ok := h.since[k]
		if !ok || cur.state != o.State {
			cur = run{state: o.State, since: at}
		}
		cur.seen = at
		h.since[k] = cur
	}
	for k, cur := range h.since {
		if !cur.seen.Equal(at) {
			delete(h.since, k)
		}
	}
	h.rounds = append(h.rounds, r)
	cut := 0
	for cut < len(h.rounds) && at.Sub(h.rounds[cut].at) > h.keep {
		cut++
	}
	// Reslicing keeps memory to about twice the kept samples: append
	// copies only the live ones when it next grows the array.
	h.rounds = h.rounds[cut:]
}

// Since returns when the region's lease on quota entered the state it
// had at the last sample (the first sample that saw it, if it has had
// that state since the history began), and false for a lease the last
// sample did not see.
func (h *History) Since(quota, region string) (time.Time, bool) {
	r, ok := h.since[[2]string{quota, region}]
	return r.since, ok
}

// Len is the number of samples kept.
func (h *History) Len() int { return len(h.rounds) }

// Chart is one quota's history as the console's script draws it.
type Chart struct {
	// Times are the samples' times in Unix milliseconds.
	Times []int64 `json:"t"`
	// Regions are sorted by name.
	Regions []ChartRegion `json:"regions"`
}

// ChartRegion is one region's series in a Chart.
type ChartRegion struct {
	Name string `json:"name"`
	// Share is in percent of the quota, one decimal; -1 where the sample
	// had no lease of the region.
	Share []float64 `json:"share"`
	// States holds one letter per sample: a(ctive), s(hrinking),
	// d(egraded), e(xpired) or - (no lease).
	States string `json:"states"`
}

// stateLetter and severity order the states for summarising a stretch of
// samples into one point: a degraded moment must not vanish from a chart.
var (
	stateLetter = map[lease.State]byte{lease.Active: 'a', lease.Shrinking: 's', lease.Degraded: 'd', lease.Expired: 'e'}
	severity    = map[byte]int{'-': 0, 'a': 1, 's': 2, 'e': 3, 'd': 4}
)

// Chart returns quota's history in at most maxPoints points. Longer
// histories are summarised in equal stretches of samples, each point
// taking the stretch's last time and share and its most severe state.
func (h *History) Chart(quota string, maxPoints int) Chart {
	var names []string
	for _, r := range h.rounds {
		for _, p := range r.quotas[quota] {
			if !slices.Contains(names, p.region) {
				names = append(names, p.region)
			}
		}
	}
	slices.Sort(names)
	n := len(h.rounds)
	per := max(1, (n+maxPoints-1)/max(1, maxPoints))
	c := Chart{Times: []int64{}, Regions: make([]ChartRegion, len(names))}
	states := make([][]byte, len(names))
	for i, name := range names {
		c.Regions[i] = ChartRegion{Name: name, Share: []float64{}}
	}
	for from := 0; from < n; from += per {
		to := min(n, from+per)
		c.Times = append(c.Times, h.rounds[to-1].at.UnixMilli())
		for i, name := range names {
			share, letter := -1.0, byte('-')
			for _, r := range h.rounds[from:to] {
				for _, p := range r.quotas[quota] {
					if p.region != name {
						continue
					}
					share = math.Round(float64(p.share)*1000) / 10
					if l := stateLetter[p.state]; severity[l] > severity[letter] {
						letter = l
					}
				}
			}
			c.Regions[i].Share = append(c.Regions[i].Share, share)
			states[i] = append(states[i], letter)
		}
	}
	for i := range names {
		c.Regions[i].States = string(states[i])
	}
	return c
}
