// Package promnames reads the metric names the deployment artifacts
// (deploy/prometheus/alerts.yaml, deploy/grafana/*.json) query, so that
// each binary's tests can check them against what it really exports.
package promnames

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var nameRE = regexp.MustCompile(`quotalease_[a-z_]+`)

// Queried returns the metric names with prefix (e.g. "quotalease_agent_")
// that the alert rules and dashboards under deployDir query, as exported
// families: a histogram's _bucket, _sum and _count name its family.
func Queried(deployDir, prefix string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(deployDir, "grafana", "*.json"))
	if err != nil {
		return nil, err
	}
	files = append(files, filepath.Join(deployDir, "prometheus", "alerts.yaml"))
	set := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range nameRE.FindAllString(string(b), -1) {
			if !strings.HasPrefix(m, prefix) {
				continue
			}
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			set[m] = true
		}
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out, nil
}
