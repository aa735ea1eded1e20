package sim

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// arrival is one request: when (true time), where, who and how much.
type arrival struct {
	t        time.Duration
	region   int
	identity int // index into the identity table
	cost     int64
	envoy    int // 1 + the Envoy instance it arrives at; 0: a direct check
}

// MaxTraceLines bounds a trace file.
const MaxTraceLines = 10_000_000

// readTrace reads explicit arrivals, one per line: "t_ms region identity
// cost" separated by spaces or tabs; blank lines and lines starting with
// '#' are skipped. Identities are attribute values; they are added to ids.
func readTrace(path string, regions map[string]int, ids *identities) ([]arrival, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	var out []arrival
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		bad := func(why string) error {
			return fmt.Errorf("trace %s line %d: %s (want: t_ms region identity cost)", path, line, why)
		}
		if len(fields) != 4 {
			return nil, bad(fmt.Sprintf("%d fields", len(fields)))
		}
		t, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || t < 0 {
			return nil, bad("t_ms must be a whole number of milliseconds >= 0")
		}
		r, ok := regions[fields[1]]
		if !ok {
			return nil, bad(fmt.Sprintf("unknown region %q", fields[1]))
		}
		cost, err := strconv.ParseInt(fields[3], 10, 64)
		if err != nil || cost < 1 {
			return nil, bad("cost must be a whole number >= 1")
		}
		id, err := ids.add(fields[2])
		if err != nil {
			return nil, bad(err.Error())
		}
		out = append(out, arrival{t: time.Duration(t) * time.Millisecond, region: r, identity: id, cost: cost})
		if len(out) > MaxTraceLines {
			return nil, bad(fmt.Sprintf("more than %d arrivals", MaxTraceLines))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].t < out[j].t })
	return out, nil
}
