package allocation

// Plan is one rebalancing round: the ideal split of total among regions
// under strategy s, reached from the previous targets prev (by region name)
// under damping d. A quota's first round (prev empty) is not damped: there
// is nothing to move from. The result maps every region of the input to
// its new target.
func Plan(s Strategy, total int64, regions []Region, prev map[string]int64, d Damping) (map[string]int64, error) {
	ideal, err := Allocate(s, total, regions)
	if err != nil {
		return nil, err
	}
	next := ideal
	if len(prev) > 0 {
		p := make([]int64, len(regions))
		floors := make([]int64, len(regions))
		for i, r := range regions {
			p[i], floors[i] = prev[r.Name], r.Floor
		}
		next = Damp(p, ideal, floors, total, d)
	}
	out := make(map[string]int64, len(regions))
	for i, r := range regions {
		out[r.Name] = next[i]
	}
	return out, nil
}
