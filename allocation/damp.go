package allocation

import "github.com/quota-lease/quota-lease/scale"

// Damping slows rebalancing down to what operators expect: shares that
// move a bounded amount per round and stay put for small changes.
type Damping struct {
	// MaxStep is the most a region's target may change in one round
	// (0: unlimited).
	MaxStep int64
	// Hysteresis: a change smaller than this is not made, unless it is a
	// decrease another region's increase needs.
	Hysteresis int64
}

// Damp moves prev toward ideal under d and returns the new targets. Floors
// are honoured (a region below its floor jumps to it), and the result never
// sums above total: increases are scaled down, in proportion, to what the
// decreases and the unused total leave. Small decreases held back by
// hysteresis are made after all when an increase is waiting for them, so
// hysteresis never blocks convergence.
func Damp(prev, ideal []int64, floors []int64, total int64, d Damping) []int64 {
	at := func(v []int64, i int) int64 {
		if i < len(v) {
			return v[i]
		}
		return 0
	}
	step := func(i int, hysteresis int64) int64 {
		p := at(prev, i)
		delta := ideal[i] - p
		switch {
		case abs(delta) < hysteresis:
			delta = 0
		case d.MaxStep > 0 && delta > d.MaxStep:
			delta = d.MaxStep
		case d.MaxStep > 0 && delta < -d.MaxStep:
			delta = -d.MaxStep
		}
		return max(p+delta, at(floors, i))
	}
	next := make([]int64, len(ideal))
	for i := range ideal {
		next[i] = step(i, d.Hysteresis)
	}
	fixed, inc := fund(prev, next)
	if inc > total-fixed {
		for i := range next {
			if ideal[i] < at(prev, i) && next[i] == at(prev, i) {
				next[i] = step(i, 0) // a held-back decrease is needed now
			}
		}
		fixed, inc = fund(prev, next)
	}
	if room := max(total-fixed, 0); inc > room {
		for i := range next {
			if p := at(prev, i); next[i] > p {
				next[i] = p + scale.Down(next[i]-p, room, inc)
			}
		}
	}
	return next
}

// fund returns what the regions that stay or shrink keep (plus the current
// share of the growing ones), and the growing ones' total increase.
func fund(prev, next []int64) (fixed, inc int64) {
	for i := range next {
		p := int64(0)
		if i < len(prev) {
			p = prev[i]
		}
		if next[i] > p {
			fixed += p
			inc += next[i] - p
		} else {
			fixed += next[i]
		}
	}
	return fixed, inc
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
