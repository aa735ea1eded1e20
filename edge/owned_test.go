package edge

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
)

// TestOwnedViewsKeepWhatTheySaw checks owned against a plain map through
// random writes: every view reads what the map held when it was taken,
// however much was written after (and bases made anew in between), and
// lists every identity holding a reservation.
func TestOwnedViewsKeepWhatTheySaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var o owned
	want := map[ID]int64{}
	type taken struct {
		v    ownedView
		want map[ID]int64
	}
	var views []taken
	for i := range 5000 {
		id := ID{"p", fmt.Sprint(rng.IntN(200))}
		v := rng.Int64N(5) - 1 // some none (0 or below)
		o.set(id, v)
		if v > 0 {
			want[id] = v
		} else {
			delete(want, id)
		}
		if i%7 == 0 {
			views = append(views, taken{o.view(), maps.Clone(want)})
		}
	}
	for n, tk := range views {
		seen := map[ID]bool{}
		tk.v.ids(func(id ID) bool { seen[id] = true; return false })
		for i := range 200 {
			id := ID{"p", fmt.Sprint(i)}
			if got := tk.v.get(id); got != tk.want[id] {
				t.Fatalf("view %d: %v reads %d, held %d when taken", n, id, got, tk.want[id])
			}
			if tk.want[id] > 0 && !seen[id] {
				t.Fatalf("view %d does not list %v, which held %d", n, id, tk.want[id])
			}
		}
	}
}
