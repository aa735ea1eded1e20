package agent

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/regional"
)

// An agent that stops writes its edge reservations down to its
// assignments' life: its entry in the region's Redis ends when its Envoy
// instances' last assignment may have, not after the entry's usual life
// (about twice an assignment's: here 1.2 s more), so the agents those
// instances move to may use the rest sooner.
func TestStoppedAgentShortensItsReservation(t *testing.T) {
	rs := startRedis(t)
	ra, in := servedEnvoy(t, rs.Addr)
	me := regional.EdgeAgentOf(ra.a.leaser.nonce, "").ID
	ra.stop() // right after a first assignment: the entry's usual life is about one more
	testenv.WaitFor(t, 10*time.Second, "the Envoy's assignment expired", func() bool {
		st, ok := in.State(acme)
		return ok && !st.Assigned
	})

	rdb := rs.Client(t)
	now := rdb.Time(t.Context()).Val()
	for _, v := range rdb.HGetAll(t.Context(), regional.NewRegion(rdb, "us").Key("edge")).Val() {
		for _, line := range strings.Split(v, "\n") {
			w := strings.Fields(line)
			if len(w) < 5 || w[0] != me {
				continue
			}
			exp, _ := strconv.ParseInt(w[4], 10, 64)
			// The clocks' drift and the Envoy's delivery margin past it.
			if left := time.UnixMilli(exp).Sub(now); left > 250*time.Millisecond {
				t.Fatalf("the stopped agent's entry %q lives %v past its Envoy's assignment", line, left)
			}
		}
	}
}
