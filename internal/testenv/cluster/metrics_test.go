package cluster

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// metricSample is one series read from a /metrics page: its name, its
// labels as written between the braces ("" for none), and its value.
type metricSample struct {
	name, labels string
	value        float64
}

// scrape reads the metrics page at url (Prometheus's text format) through
// web: every series, in the page's order. A series whose value does not
// parse fails t. The tests and benchmarks that read what a process counts
// select their series from it.
func scrape(t testing.TB, web *http.Client, url string) []metricSample {
	t.Helper()
	resp, err := web.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []metricSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, line, err)
		}
		s := metricSample{name: line[:sp], value: v}
		if i := strings.IndexByte(s.name, '{'); i >= 0 {
			s.name, s.labels = s.name[:i], strings.TrimSuffix(s.name[i+1:], "}")
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
