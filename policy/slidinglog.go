package policy

// slidingLog is the sliding log transition (lua/sliding_log.lua).
//
// The log holds every admitted request of the last WindowMs; an entry
// admitted at t stops counting at t+WindowMs. Each entry costs at least one
// unit and the sum never exceeds the limit, so the log never holds more
// than Capacity/Micro entries.
//
// Under limits that count charges after the fact (Limits.PostHoc) a charge
// that does not fit is logged all the same, and the sum goes over the
// limit. The log then holds at most MaxLogEntries entries: a charge that
// finds it full takes the newest entry into its own, at now, which counts
// that entry's cost longer than it would have been, never less.
func slidingLog(s State, l Limits, now, cost int64) (State, Decision) {
	if s.Exists && now < s.LastMs {
		now = s.LastMs
	}
	// Drop what has left the window: entries with AtMs <= now-WindowMs.
	log, sum := s.Log, s.Sum
	i := 0
	for i < len(log) && log[i].AtMs <= now-l.WindowMs {
		sum -= log[i].Cost
		i++
	}
	kept := make([]LogEntry, len(log)-i, len(log)-i+1)
	copy(kept, log[i:])
	var d Decision
	fits := sum+cost <= l.Capacity
	owed := cost                    // what must still fit for the retry: nothing once counted
	if l.counts(fits) && cost > 0 { // a charge of 0 (a check, Return bringing the log to now) logs nothing
		e := LogEntry{AtMs: now, Cost: min(cost, l.Capacity+MaxDebt-sum)}
		sum += e.Cost
		if n := len(kept); n >= int(MaxLogEntries) {
			e.Cost += kept[n-1].Cost
			kept = kept[:n-1]
		}
		kept = append(kept, e)
		owed = 0
	}
	if d.Allowed = fits; !fits {
		// Wait until enough of the oldest entries have left the window.
		free := sum
		for _, e := range kept {
			free -= e.Cost
			if free+owed <= l.Capacity {
				d.RetryAfterMs = e.AtMs + l.WindowMs - now
				break
			}
		}
	}
	d.SetLeft(l.Capacity - sum)
	if n := len(kept); n > 0 {
		d.ResetAfterMs = kept[n-1].AtMs + l.WindowMs - now
	}
	return State{Exists: true, LastMs: now, Log: kept, Sum: sum}, d
}
