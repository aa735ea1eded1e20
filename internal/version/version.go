// Package version says which build of quota-lease is running: the module
// version and VCS revision Go records in every binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// revision is the VCS revision when the build could not record one itself
// (go build -buildvcs=false): make build sets it with -ldflags -X.
var revision string

// Info is what a binary knows about its build.
type Info struct {
	Version  string // the module version, "(devel)" for a local build
	Revision string // the VCS revision, with "+dirty" for uncommitted changes
	Go       string
}

// Get reads the build information of the running binary.
func Get() Info {
	i := Info{Version: "(devel)", Revision: "unknown", Go: runtime.Version()}
	if revision != "" {
		i.Revision = revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return i
	}
	if v := bi.Main.Version; v != "" {
		i.Version = v
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		i.Revision += "+dirty"
	}
	return i
}

// String is the one line --version prints.
func (i Info) String() string {
	return fmt.Sprintf("quota-lease %s (revision %s, %s)", i.Version, i.Revision, i.Go)
}

// Collector exports quotalease_build_info{component,version,revision,goversion} 1.
func Collector(component string) prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quotalease_build_info",
		Help: "1, labelled with the running build: component, module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{
			"component": component,
			"version":   i.Version,
			"revision":  i.Revision,
			"goversion": i.Go,
		},
	})
	g.Set(1)
	return g
}
