package policy

// slidingLog is the sliding log transition (lua/sliding_log.lua).
//
// The log holds every admitted request of the last WindowMs; an entry
// admitted at t stops counting at t+WindowMs. Each entry costs at least one
// unit and the sum never exceeds the limit, so the log never holds more
// than Capacity/Micro entries.
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
	if sum+cost <= l.Capacity {
		if cost > 0 { // a charge of 0 (Return bringing the log to now) logs nothing
			kept = append(kept, LogEntry{AtMs: now, Cost: cost})
			sum += cost
		}
		d.Allowed = true
	} else {
		// Wait until enough of the oldest entries have left the window.
		free := sum
		for _, e := range kept {
			free -= e.Cost
			if free+cost <= l.Capacity {
				d.RetryAfterMs = e.AtMs + l.WindowMs - now
				break
			}
		}
	}
	d.Remaining = l.Capacity - sum
	if d.Remaining < 0 {
		d.Remaining = 0
	}
	if n := len(kept); n > 0 {
		d.ResetAfterMs = kept[n-1].AtMs + l.WindowMs - now
	}
	return State{Exists: true, LastMs: now, Log: kept, Sum: sum}, d
}
