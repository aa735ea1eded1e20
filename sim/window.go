package sim

// windowMax tracks, per identity, the admitted cost in the window of
// length w ending at each admission, and the largest seen: the observed
// quantity the bound is about.
type windowMax struct {
	w      int64 // ms
	per    map[int]*ring
	max    int64 // micro-units
	maxID  int
	maxAtT int64
}

type ring struct {
	t, c []int64
	head int
	sum  int64
}

func newWindowMax(wMs int64) *windowMax { return &windowMax{w: wMs, per: map[int]*ring{}} }

// add records an admission of cost at tMs (non-decreasing per identity
// up to small reorderings, which only make the window larger) and returns
// the identity's admitted cost in the window ending there.
func (m *windowMax) add(id int, tMs, cost int64) int64 {
	r := m.per[id]
	if r == nil {
		r = &ring{}
		m.per[id] = r
	}
	r.t = append(r.t, tMs)
	r.c = append(r.c, cost)
	r.sum += cost
	for r.head < len(r.t) && r.t[r.head] <= tMs-m.w {
		r.sum -= r.c[r.head]
		r.head++
	}
	if r.head > 1024 && r.head*2 > len(r.t) { // compact
		r.t = append([]int64(nil), r.t[r.head:]...)
		r.c = append([]int64(nil), r.c[r.head:]...)
		r.head = 0
	}
	if r.sum > m.max {
		m.max, m.maxID, m.maxAtT = r.sum, id, tMs
	}
	return r.sum
}
