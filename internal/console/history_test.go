package console

import (
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/lease"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func obs(quota, region string, share float64, state lease.State) Observation {
	return Observation{Quota: quota, Region: region, Share: share, State: state}
}

func TestHistorySince(t *testing.T) {
	h := NewHistory(time.Minute)
	h.Record(t0, []Observation{obs("q", "us", .5, lease.Active), obs("q", "eu", .5, lease.Active)})
	h.Record(t0.Add(time.Second), []Observation{obs("q", "us", .5, lease.Active), obs("q", "eu", .1, lease.Degraded)})
	h.Record(t0.Add(2*time.Second), []Observation{obs("q", "us", .5, lease.Active), obs("q", "eu", .1, lease.Degraded)})
	if s, ok := h.Since("q", "us"); !ok || !s.Equal(t0) {
		t.Fatalf("us active since %v %v, want %v", s, ok, t0)
	}
	if s, ok := h.Since("q", "eu"); !ok || !s.Equal(t0.Add(time.Second)) {
		t.Fatalf("eu degraded since %v %v, want the first degraded sample", s, ok)
	}
	// eu vanishes (its lease expired and was forgotten): no since.
	h.Record(t0.Add(3*time.Second), []Observation{obs("q", "us", 1, lease.Active)})
	if _, ok := h.Since("q", "eu"); ok {
		t.Fatal("a region the last sample did not see still has a since")
	}
	if _, ok := h.Since("other", "us"); ok {
		t.Fatal("unknown quota has a since")
	}
}

func TestHistoryKeepsOnlyKeep(t *testing.T) {
	h := NewHistory(10 * time.Second)
	for i := range 1000 {
		h.Record(t0.Add(time.Duration(i)*time.Second), []Observation{obs("q", "us", 1, lease.Active)})
	}
	if h.Len() != 11 {
		t.Fatalf("kept %d samples of one a second for 10s, want 11", h.Len())
	}
	if c := cap(h.rounds); c > 64 {
		t.Fatalf("the kept samples' array has grown to %d", c)
	}
	c := h.Chart("q", 100)
	if len(c.Times) != 11 || c.Times[0] != t0.Add(989*time.Second).UnixMilli() {
		t.Fatalf("chart starts at %v with %d points", time.UnixMilli(c.Times[0]).UTC(), len(c.Times))
	}
}

func TestChartSummarisesWithoutLosingDegraded(t *testing.T) {
	h := NewHistory(time.Hour)
	for i := range 12 {
		st, share := lease.Active, 0.5
		if i == 4 { // one degraded sample inside a stretch
			st, share = lease.Degraded, 0.1
		}
		o := []Observation{obs("q", "us", 0.5, lease.Active)}
		if i >= 2 { // eu appears at the third sample
			o = append(o, obs("q", "eu", share, st))
		}
		h.Record(t0.Add(time.Duration(i)*time.Second), o)
	}
	c := h.Chart("q", 4) // 12 samples in stretches of 3
	if len(c.Times) != 4 || c.Times[3] != t0.Add(11*time.Second).UnixMilli() {
		t.Fatalf("times %v", c.Times)
	}
	if len(c.Regions) != 2 || c.Regions[0].Name != "eu" || c.Regions[1].Name != "us" {
		t.Fatalf("regions %+v, want eu, us by name", c.Regions)
	}
	eu := c.Regions[0]
	if eu.States != "adaa" {
		t.Fatalf("eu states %q: the degraded sample must mark its stretch", eu.States)
	}
	if eu.Share[0] != 50 || eu.Share[1] != 50 {
		t.Fatalf("eu shares %v: each stretch shows its last share in percent", eu.Share)
	}
	if got := h.Chart("q", 100); len(got.Times) != 12 || got.Regions[0].States != "--aadaaaaaaa" || got.Regions[0].Share[0] != -1 {
		t.Fatalf("unsummarised chart: %+v", got.Regions[0])
	}
	if got := h.Chart("none", 100); len(got.Regions) != 0 || len(got.Times) != 12 {
		t.Fatalf("chart of a quota never seen: %+v", got)
	}
	if strings.ContainsAny(h.Chart("q", 1).Regions[0].States, "-") {
		t.Fatal("one point summarising all samples should carry the worst state seen, not none")
	}
}
