package cluster

import (
	"fmt"
	"time"

	"github.com/quota-lease/quota-lease/bound"
	"github.com/quota-lease/quota-lease/policy"
)

// Checker recounts, from the client's own records, what each identity was
// admitted in every window, and compares each count with the bound
// published for the policies that may have been in force during it. It
// knows nothing of the system under test but the policy history the test
// itself made and the bound package's formulas.
type Checker struct {
	// Policy is the name of the policy checked.
	Policy string
	// Window is the length of the windows counted.
	Window time.Duration
	// Deployment enters the bound (regions, lease, drift, outages, delay).
	Deployment bound.Deployment
	// History is the policy as first stored (Sent zero) and every change.
	History []PolicyChange
	// Slack is how much later than the client sent it a check may have
	// been decided (the slowest admitted check): each counted window is
	// judged against the bound over Window + Slack.
	Slack time.Duration
}

// Verdict is the worst window found.
type Verdict struct {
	// Windows is how many windows (one ending at each admission) were
	// judged; Violations how many exceeded their bound.
	Windows, Violations int
	// Worst is the window with the largest count/bound ratio.
	Worst WindowCount
}

// WindowCount is the units admitted to one identity (each check one, a
// charge after the fact its cost) in the window ending at End.
type WindowCount struct {
	Identity string
	End      time.Time
	Count    int
	Bound    float64
	// Policies is how many policies may have been in force in it; more
	// than one means it was judged by the transition bound.
	Policies int
	Terms    map[string]float64
}

// Ratio is Count / Bound.
func (w WindowCount) Ratio() float64 {
	if w.Bound <= 0 {
		return 0
	}
	return float64(w.Count) / w.Bound
}

func (w WindowCount) String() string {
	return fmt.Sprintf("%d admitted for %s in the %s ending %s, bound %.1f over %d policies %v",
		w.Count, w.Identity, "window", w.End.Format("15:04:05.000"), w.Bound, w.Policies, w.Terms)
}

// Check judges every window of adm.
func (k Checker) Check(adm []Admission) (Verdict, error) {
	cache := map[[2]int]bound.Result{}
	var v Verdict
	err := forEachWindow(adm, k.Policy, k.Window, func(id string, end time.Time, count int) error {
		b, n, err := k.boundAt(end, cache)
		if err != nil {
			return err
		}
		w := WindowCount{Identity: id, End: end, Count: count, Bound: b.WorstCase, Policies: n, Terms: b.Terms}
		v.Windows++
		if float64(w.Count) > w.Bound {
			v.Violations++
		}
		if w.Ratio() > v.Worst.Ratio() {
			v.Worst = w
		}
		return nil
	})
	return v, err
}

// boundAt is the bound of the window ending at end: the steady bound of
// the one policy in force through it, or, where changes fall within a
// transition span of it, the largest transition bound between any two of
// the policies that may have been in force. A change counts from when it
// was sent until the next one was acknowledged.
func (k Checker) boundAt(end time.Time, cache map[[2]int]bound.Result) (bound.Result, int, error) {
	w := k.Window + k.Slack
	from := end.Add(-bound.TransitionSpan(k.Deployment, w))
	var live []int
	for i, ch := range k.History {
		until := time.Time{} // in force until the next change is acknowledged (forever if never)
		if i+1 < len(k.History) {
			until = k.History[i+1].Acked
		}
		if ch.Sent.After(end) || (!until.IsZero() && until.Before(from)) {
			continue
		}
		live = append(live, i)
	}
	if len(live) == 0 {
		return bound.Result{}, 0, fmt.Errorf("no policy in force at %s", end)
	}
	best := bound.Result{}
	for _, i := range live {
		for _, j := range live {
			key := [2]int{i, j}
			r, ok := cache[key]
			if !ok {
				var err error
				if i == j {
					r, err = bound.Compute(k.History[i].Policy, k.Deployment, bound.Leased, w)
				} else {
					from, to := k.History[i].Policy, k.History[j].Policy
					fresh := policy.StartsFresh(from, to)
					r, err = bound.Transition(from, to, fresh, k.Deployment, bound.Leased, w)
				}
				if err != nil {
					return bound.Result{}, 0, err
				}
				cache[key] = r
			}
			if r.WorstCase > best.WorstCase {
				best = r
			}
		}
	}
	return best, len(live), nil
}
