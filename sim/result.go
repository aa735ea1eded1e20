package sim

import (
	"encoding/json"
	"io"
	"time"

	"github.com/quota-lease/quota-lease/bound"
)

// Result is one scenario's outcome: summary.json.
type Result struct {
	Scenario    string        `json:"scenario"`
	Description string        `json:"description,omitempty"`
	Seed        uint64        `json:"seed"`
	Duration    string        `json:"duration"`
	Window      string        `json:"window"`
	Regions     []string      `json:"regions"`
	Modes       []*ModeResult `json:"modes"`
	// Edge is what the Envoy instances did (scenarios with an edge).
	Edge   *EdgeResult `json:"edge,omitempty"`
	Series *Series     `json:"-"`
}

// ModeResult is what one mode did over the scenario.
type ModeResult struct {
	Mode     string `json:"mode"`
	Requests int64  `json:"requests"`
	Admitted int64  `json:"admitted"`
	Rejected int64  `json:"rejected"`
	// Limit is the reference: the most one ideal global limiter admits for
	// one identity in any window (units).
	Limit float64 `json:"limit"`
	// Bound is what bound.Compute says this mode can admit in a window;
	// BoundTerms its parts.
	Bound      float64            `json:"bound"`
	BoundTerms map[string]float64 `json:"bound_terms"`
	// MaxWindow is the most admitted for one identity in any window, and
	// where; MaxOvershoot is how far that is above Limit.
	MaxWindow         float64 `json:"max_window"`
	MaxWindowIdentity string  `json:"max_window_identity,omitempty"`
	MaxWindowAtMs     int64   `json:"max_window_at_ms"`
	MaxOvershoot      float64 `json:"max_overshoot"`
	WithinBound       bool    `json:"within_bound"`
	// Utilization is admitted / what the ideal global limiter admitted
	// (= min(demand, limit) request by request); with conversations, the
	// tokens charged / the ideal limiter's.
	Utilization float64 `json:"utilization"`
	// RejectedWhileFree counts valid requests rejected that the ideal
	// global limiter admitted: global capacity was free.
	RejectedWhileFree int64 `json:"rejected_while_free"`
	// LeaseMessages (leased) and AddedLatencyMs (central: per request).
	LeaseMessages  int64            `json:"lease_messages,omitempty"`
	AddedLatencyMs float64          `json:"added_latency_ms,omitempty"`
	DecisionModes  map[string]int64 `json:"decision_modes,omitempty"`
	// Epochs judges each stretch under one policy on its own: its limit,
	// reference, bound and most admitted in a window, and the same for the
	// transition after each change. MaxOvershoot, Bound and WithinBound
	// above are the worst over them.
	Epochs []EpochResult `json:"epochs"`
	// Conversations: with them, Requests and Admitted count checks, and
	// the windows, MaxWindow and Utilization the tokens charged.
	Conversations *ConversationResult `json:"conversations,omitempty"`
}

func (m *ModeResult) countMode(mode string) {
	if m.DecisionModes == nil {
		m.DecisionModes = map[string]int64{}
	}
	m.DecisionModes[mode]++
}

// Mode returns the result of mode name, or nil.
func (r *Result) Mode(name string) *ModeResult {
	for _, m := range r.Modes {
		if m.Mode == name {
			return m
		}
	}
	return nil
}

// WriteSummary writes summary.json.
func (r *Result) WriteSummary(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Series is admissions over time for the plots: the hot identity's
// (identity 0) admitted cost per bin, per region under leasing and in
// total per mode.
type Series struct {
	BinMs      int64
	Regions    []string
	PerRegion  [][]int64 // [region][bin], leased
	PerMode    [][]int64 // [mode][bin]
	Limit      float64   // reference per bin
	Bound      float64   // leased bound per bin
	BoundModes []float64 // per mode
}

type series struct {
	bin       int64
	perRegion [][]int64
	perMode   [][]int64
}

func newSeries(durMs, wMs int64, regions int) *series {
	bin := max(wMs, durMs/720)
	n := int(durMs/bin) + 1
	s := &series{bin: bin}
	for i := 0; i < regions; i++ {
		s.perRegion = append(s.perRegion, make([]int64, n))
	}
	for i := 0; i <= len(systems); i++ {
		s.perMode = append(s.perMode, make([]int64, n))
	}
	return s
}

func (s *series) add(mode, region, identity int, atMs, cost int64) {
	if identity != 0 {
		return
	}
	b := int(atMs / s.bin)
	if b >= len(s.perMode[mode]) {
		return
	}
	s.perMode[mode][b] += cost
	if mode == 0 {
		s.perRegion[region][b] += cost
	}
}

func (s *series) finish(e *engine, ref float64, w time.Duration) *Series {
	bin := time.Duration(s.bin) * time.Millisecond
	out := &Series{BinMs: s.bin, Regions: e.s.Regions, PerRegion: s.perRegion, PerMode: s.perMode,
		Limit: bound.Reference(e.maxPolicy, bin)}
	d := bound.Deployment{
		Regions:       len(e.regions),
		Instances:     1,
		LeaseDuration: e.timing.ValidFor,
		Drift:         e.s.Lease.Drift,
		RedisOutages:  e.outages,
	}
	if b, err := bound.Compute(e.maxPolicy, d, bound.Leased, bin); err == nil {
		out.Bound = b.WorstCase
	}
	return out
}
