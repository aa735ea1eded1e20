// Package deploy holds the deployment artifacts (Dockerfile, systemd
// units, the Helm chart and the kustomize base rendered from it); its
// tests check that every flag they pass exists in the binaries, and how
// they are built, pinned and hardened.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
)

// flagRE finds --flag tokens.
var flagRE = regexp.MustCompile(`(?:^|\s|")--([a-z][a-z0-9-]*)`)

// helpFlags returns the flags `bin serve -h` lists.
func helpFlags(t *testing.T, bin string) map[string]bool {
	out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 10 {
		t.Fatalf("%s serve -h listed %d flags:\n%s", bin, len(flags), out)
	}
	return flags
}

// The systemd units, example configuration files, Kubernetes manifests
// and the Helm chart's templates pass only flags the binaries have: a renamed flag fails here, not at
// someone's 3 a.m. deploy.
func TestArtifactFlagsExist(t *testing.T) {
	testenv.SkipSlow(t, "builds the binaries and runs them")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bins, err := cluster.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]map[string]bool{"coordinator": helpFlags(t, bins.Coordinator), "regional-agent": helpFlags(t, bins.Agent)}
	check := func(where, binary, text string) {
		flags := flagRE.FindAllStringSubmatch(text, -1)
		if len(flags) == 0 {
			t.Errorf("%s: no flags found for %s", where, binary)
		}
		for _, m := range flags {
			if !known[binary][m[1]] {
				t.Errorf("%s passes --%s, which %s serve does not have", where, m[1], binary)
			}
		}
	}
	for unit, binary := range map[string]string{"quota-lease-coordinator.service": "coordinator", "quota-lease-agent.service": "regional-agent"} {
		b, err := os.ReadFile(filepath.Join("systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		exec := regexp.MustCompile(`(?s)ExecStart=(.*?[^\\])\n`).FindStringSubmatch(string(b))
		if exec == nil {
			t.Fatalf("%s has no ExecStart", unit)
		}
		check(unit, binary, strings.ReplaceAll(exec[1], "\\\n", " "))
	}
	for file, binary := range map[string]string{"coordinator.yaml": "coordinator", "agent.yaml": "regional-agent"} {
		b, err := os.ReadFile(filepath.Join("config", file))
		if err != nil {
			t.Fatal(err)
		}
		var settings map[string]any
		if err := yaml.Unmarshal(b, &settings); err != nil || len(settings) == 0 {
			t.Fatalf("config/%s: %v (%d settings)", file, err, len(settings))
		}
		for k := range settings {
			if !known[binary][k] {
				t.Errorf("config/%s sets %q, which %s serve does not have", file, k, binary)
			}
		}
	}
	manifests, _ := filepath.Glob(filepath.Join("kubernetes", "base", "*.yaml"))
	containers := 0
	for _, path := range manifests {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc struct {
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Name  string   `yaml:"name"`
								Image string   `yaml:"image"`
								Args  []string `yaml:"args"`
							} `yaml:"containers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			for _, c := range doc.Spec.Template.Spec.Containers {
				containers++
				binary := "coordinator"
				if strings.Contains(c.Image, "regional-agent") {
					binary = "regional-agent"
				}
				check(path+" container "+c.Name, binary, " "+strings.Join(c.Args, " "))
			}
		}
	}
	if containers != 2 {
		t.Fatalf("found %d containers in the manifests, want the coordinator and the agent", containers)
	}
	// The chart's templates, whatever their values render: every flag
	// they may pass (the rendering above has the defaults').
	for file, binary := range map[string]string{"coordinator.yaml": "coordinator", "agent.yaml": "regional-agent"} {
		b, err := os.ReadFile(filepath.Join(chartDir, "templates", file))
		if err != nil {
			t.Fatal(err)
		}
		check(chartDir+"/templates/"+file, binary, string(b))
	}
}

// The alert rules parse, and every metric they use is one the binaries
// export (a metric renamed in code fails here).
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	metricRE := regexp.MustCompile(`quotalease_[a-z_]+`)
	for _, dir := range []string{"../internal", "../cmd"} {
		filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
			if err == nil && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				src, _ := os.ReadFile(path)
				for _, m := range regexp.MustCompile(`"(quotalease_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
					exported[m[1]] = true
				}
			}
			return nil
		})
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("rule %+v lacks an alert name or expression", r)
			}
			for _, m := range metricRE.FindAllString(r.Expr, -1) {
				if !exported[m] {
					t.Errorf("alert %s uses %s, which no binary exports", r.Alert, m)
				}
			}
		}
	}
	if n == 0 || len(exported) < 10 {
		t.Fatalf("%d rules, %d exported metrics found", n, len(exported))
	}
}
