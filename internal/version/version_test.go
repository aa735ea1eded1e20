package version

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestVersionAndBuildInfo(t *testing.T) {
	revision = "abc123"
	defer func() { revision = "" }()
	i := Get()
	if i.Revision != "abc123" || i.Go == "" || !strings.Contains(i.String(), "revision abc123") {
		t.Fatalf("%+v / %s", i, i)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector("agent"))
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "quotalease_build_info" || mfs[0].GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatalf("build info metric: %v %v", mfs, err)
	}
	labels := map[string]string{}
	for _, l := range mfs[0].GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["component"] != "agent" || labels["revision"] != "abc123" {
		t.Fatalf("labels %v", labels)
	}
}
