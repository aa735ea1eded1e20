package coordinator

import (
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/promnames"
	"github.com/quota-lease/quota-lease/internal/version"
)

// Every coordinator metric the alert rules and the Grafana dashboard
// query is one the coordinator's /metrics describes (some, such as the
// refusals by method and reason, have series only once something happened).
func TestDeployedQueriesUseExportedMetrics(t *testing.T) {
	r := startReplica(t, testenv.Prefix(t), "metrics", nil)
	ch := make(chan *prometheus.Desc, 64)
	for _, c := range []prometheus.Collector{collector{r.c}, r.c.etcdWrite, version.Collector("coordinator")} {
		c.Describe(ch)
	}
	close(ch)
	exported := map[string]bool{}
	nameRE := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		if m := nameRE.FindStringSubmatch(d.String()); m != nil {
			exported[m[1]] = true
		}
	}
	queried, err := promnames.Queried("../../deploy", "quotalease_coordinator_")
	if err != nil {
		t.Fatal(err)
	}
	if len(queried) < 5 || len(exported) < 5 {
		t.Fatalf("%d coordinator metrics queried (%v), %d described", len(queried), queried, len(exported))
	}
	for _, m := range queried {
		if !exported[m] {
			t.Errorf("the deploy artifacts query %s, which the coordinator does not export", m)
		}
	}
}
