package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// chartDir is the Helm chart; renderedBase is the chart rendered with its
// default values into the kustomize base (make manifests).
const (
	chartDir     = "helm/quota-lease"
	renderedBase = "kubernetes/base/quota-lease.yaml"
)

// imageSettings reads deploy/images.env, the one place the registry and
// the tag are set.
func imageSettings(t *testing.T) (registry, version string) {
	t.Helper()
	b, err := os.ReadFile("images.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^(REGISTRY|VERSION)\s*\??=\s*(\S+)\s*$`).FindAllStringSubmatch(string(b), -1) {
		if m[1] == "REGISTRY" {
			registry = m[2]
		} else {
			version = m[2]
		}
	}
	if registry == "" || version == "" {
		t.Fatalf("images.env sets REGISTRY %q and VERSION %q; want both", registry, version)
	}
	return registry, version
}

// manifest is one Kubernetes object, as much of it as the tests read.
type manifest struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	AutomountToken *bool `yaml:"automountServiceAccountToken"`
	Spec           struct {
		PolicyTypes []string         `yaml:"policyTypes"`
		Ingress     []map[string]any `yaml:"ingress"`
		Egress      []map[string]any `yaml:"egress"`
		Template    struct {
			Spec struct {
				AutomountToken *bool          `yaml:"automountServiceAccountToken"`
				ServiceAccount string         `yaml:"serviceAccountName"`
				Affinity       map[string]any `yaml:"affinity"`
				Spread         []any          `yaml:"topologySpreadConstraints"`
				Containers     []struct {
					Name         string         `yaml:"name"`
					Image        string         `yaml:"image"`
					Args         []string       `yaml:"args"`
					StartupProbe map[string]any `yaml:"startupProbe"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// parseManifests decodes every YAML document of b.
func parseManifests(t *testing.T, where string, b []byte) []manifest {
	t.Helper()
	var out []manifest
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var m manifest
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if m.Kind != "" {
			out = append(out, m)
		}
	}
}

// The images are pinned, and their registry and tag are set in one place:
// the chart's values and appVersion say what images.env says, the
// rendered manifests use exactly those images, and nothing under deploy/
// names a :latest image.
func TestImagesPinnedInOnePlace(t *testing.T) {
	registry, version := imageSettings(t)
	var values struct {
		Image struct{ Registry, Tag string } `yaml:"image"`
	}
	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	for file, v := range map[string]any{"values.yaml": &values, "Chart.yaml": &chart} {
		b, err := os.ReadFile(filepath.Join(chartDir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if values.Image.Registry != registry || values.Image.Tag != "" || chart.AppVersion != version {
		t.Errorf("chart: registry %q, tag %q, appVersion %q; want images.env's registry %q, an empty tag and appVersion %q",
			values.Image.Registry, values.Image.Tag, chart.AppVersion, registry, version)
	}
	b, err := os.ReadFile(renderedBase)
	if err != nil {
		t.Fatal(err)
	}
	images := 0
	for _, m := range parseManifests(t, renderedBase, b) {
		for _, c := range m.Spec.Template.Spec.Containers {
			images++
			bin := "coordinator"
			if c.Name == "agent" {
				bin = "regional-agent"
			}
			if want := registry + "/" + bin + ":" + version; c.Image != want {
				t.Errorf("%s %s runs image %q, want %q", m.Kind, m.Metadata.Name, c.Image, want)
			}
		}
	}
	if images != 2 {
		t.Errorf("%d containers in %s, want the coordinator and the agent", images, renderedBase)
	}
	filepath.Walk(".", func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, _ := os.ReadFile(path)
		if regexp.MustCompile(`(?m)(image:|FROM)\s*\S+:latest\b`).Match(b) {
			t.Errorf("%s names a :latest image", path)
		}
		return nil
	})
}

// The Dockerfile's stages are what `make images` needs, read without
// Docker: a Go build stage on go.mod's toolchain that builds ./cmd/${BIN}
// static, then a distroless stage that runs it as a non-root user; every
// binary `make images` builds is a command of the module.
func TestDockerfileStages(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	type stage struct {
		from, name string
		lines      []string
	}
	var stages []*stage
	for _, line := range strings.Split(strings.ReplaceAll(string(b), "\\\n", " "), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if f := strings.Fields(line); strings.EqualFold(f[0], "FROM") {
			s := &stage{from: f[1]}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				s.name = f[3]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %s", line)
		}
		stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, line)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	gomod, _ := os.ReadFile("../go.mod")
	goVersion := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(gomod)
	build, run := stages[0], stages[1]
	if goVersion == nil || !strings.HasPrefix(build.from, "golang:"+string(goVersion[1])) || build.name != "build" {
		t.Errorf("build stage FROM %s AS %s; want golang:%s... AS build (go.mod's toolchain)", build.from, build.name, goVersion[1])
	}
	joined := strings.Join(build.lines, "\n")
	for _, want := range []string{"ARG BIN=coordinator", "CGO_ENABLED=0 go build", "./cmd/${BIN}", "internal/version.revision=${REVISION}"} {
		if !strings.Contains(joined, want) {
			t.Errorf("build stage lacks %q", want)
		}
	}
	if !strings.HasPrefix(run.from, "gcr.io/distroless/static") || !strings.HasSuffix(run.from, ":nonroot") {
		t.Errorf("runtime stage FROM %s, want a distroless static nonroot image", run.from)
	}
	joined = strings.Join(run.lines, "\n")
	user := regexp.MustCompile(`(?m)^USER (\d+)(?::(\d+))?$`).FindStringSubmatch(joined)
	if user == nil || user[1] == "0" || !strings.Contains(joined, "COPY --from=build /out/app") || !strings.Contains(joined, "ENTRYPOINT [") {
		t.Errorf("runtime stage must copy the build's binary, run it as a numeric non-root USER and have an ENTRYPOINT:\n%s", joined)
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	target := regexp.MustCompile(`(?m)^images:.*\n((?:\t.*\n)+)`).FindSubmatch(mk)
	if target == nil {
		t.Fatal("the Makefile has no images target")
	}
	bins := regexp.MustCompile(`for bin in ([a-z -]+);`).FindSubmatch(target[1])
	if bins == nil || !bytes.Contains(target[1], []byte("$(REGISTRY)/$$bin:$(VERSION)")) || !bytes.Contains(target[1], []byte("deploy/docker/Dockerfile")) {
		t.Fatalf("make images does not build $(REGISTRY)/<bin>:$(VERSION) from deploy/docker/Dockerfile:\n%s", target[1])
	}
	for _, bin := range strings.Fields(string(bins[1])) {
		if _, err := os.Stat(filepath.Join("..", "cmd", bin)); err != nil {
			t.Errorf("make images builds %s, which is not a command: %v", bin, err)
		}
	}
}

// helmPath is helm on PATH, or "" where it is not installed (make helm
// installs it).
func helmPath(t *testing.T) string {
	p, err := exec.LookPath("helm")
	if err != nil {
		t.Log("helm is not on PATH (make helm installs it): checking the committed rendering only")
		return ""
	}
	return p
}

// With helm, the chart lints clean, its default rendering is the one
// committed as the kustomize base, a ServiceMonitor renders when asked
// for, and an image tag "latest" is refused.
func TestChartLintsAndRenders(t *testing.T) {
	helm := helmPath(t)
	if helm == "" {
		t.Skip("helm is not installed")
	}
	out, err := exec.Command(helm, "lint", "--strict", chartDir).CombinedOutput()
	if err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	rendered, err := exec.Command(helm, "template", "quota-lease", chartDir, "--namespace", "default").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	committed, err := os.ReadFile(renderedBase)
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := bytes.Cut(committed, []byte("\n"))
	if !bytes.Equal(body, rendered) {
		t.Errorf("%s is not the chart's rendering: run make manifests", renderedBase)
	}
	out, err = exec.Command(helm, "template", "quota-lease", chartDir, "--set", "serviceMonitor.enabled=true").Output()
	if err != nil || bytes.Count(out, []byte("kind: ServiceMonitor")) != 2 {
		t.Errorf("with serviceMonitor.enabled: %v, %d ServiceMonitors, want 2", err, bytes.Count(out, []byte("kind: ServiceMonitor")))
	}
	if out, err := exec.Command(helm, "template", "x", chartDir, "--set", "image.tag=latest").CombinedOutput(); err == nil || !bytes.Contains(out, []byte("pin a version")) {
		t.Errorf("image.tag=latest rendered (%v): %s", err, out)
	}
}

// The rendered manifests are hardened as docs/runbook.md says: no API
// token mounted, coordinators spread over nodes and zones, an agent
// startup probe, a PodDisruptionBudget for each part, NetworkPolicies
// with named sources and egress rules, and coordinators advertising a
// stable DNS name their certificate can cover rather than a pod IP.
func TestRenderedManifestsHardened(t *testing.T) {
	b, err := os.ReadFile(renderedBase)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, m := range parseManifests(t, renderedBase, b) {
		kinds[m.Kind]++
		where := m.Kind + " " + m.Metadata.Name
		switch m.Kind {
		case "ServiceAccount":
			if m.AutomountToken == nil || *m.AutomountToken {
				t.Errorf("%s mounts an API token", where)
			}
		case "StatefulSet", "Deployment":
			ps := m.Spec.Template.Spec
			if ps.AutomountToken == nil || *ps.AutomountToken || ps.ServiceAccount == "" {
				t.Errorf("%s: service account %q, token automount %v; want the chart's, off", where, ps.ServiceAccount, ps.AutomountToken)
			}
			if len(ps.Spread) == 0 {
				t.Errorf("%s has no topology spread", where)
			}
			for _, c := range ps.Containers {
				args := strings.Join(c.Args, " ")
				if strings.Contains(args, "POD_IP") {
					t.Errorf("%s advertises a pod IP, which no certificate covers", where)
				}
				if c.Name == "agent" && c.StartupProbe == nil {
					t.Errorf("%s has no startup probe", where)
				}
				if c.Name == "coordinator" && (ps.Affinity["podAntiAffinity"] == nil || !strings.Contains(args, "--advertise=$(POD_NAME).")) {
					t.Errorf("%s: coordinators need pod anti-affinity and a per-pod DNS name to advertise", where)
				}
			}
		case "NetworkPolicy":
			if !strings.Contains(strings.Join(m.Spec.PolicyTypes, ","), "Egress") || len(m.Spec.Egress) == 0 {
				t.Errorf("%s has no egress rules", where)
			}
			for _, rule := range append(m.Spec.Ingress, m.Spec.Egress...) {
				if rule["from"] == nil && rule["to"] == nil {
					t.Errorf("%s has a rule open to anyone: %v", where, rule)
				}
			}
		}
	}
	for kind, want := range map[string]int{"ServiceAccount": 1, "StatefulSet": 1, "Deployment": 1, "PodDisruptionBudget": 2, "NetworkPolicy": 2} {
		if kinds[kind] != want {
			t.Errorf("%d %s objects rendered, want %d", kinds[kind], kind, want)
		}
	}
}

// credentialFlags are the flags that name a key, certificate or password
// file: the files `coordinator certs` writes root-owned and 0600.
var credentialFlags = regexp.MustCompile(`--((?:etcd-)?(?:cacert|cert|key)|tls-(?:cert|key|client-ca)|coordinator-tls-ca|redis-password-file|etcd-password-file)[ =](\S+)`)

// systemd's DynamicUser cannot read root's 0600 keys: every key, certificate
// and password file a unit passes comes from its credentials directory
// (%d), loaded with LoadCredential=.
func TestSystemdUnitsLoadTheirKeys(t *testing.T) {
	units, _ := filepath.Glob(filepath.Join("systemd", "*.service"))
	if len(units) != 2 {
		t.Fatalf("%d units, want 2", len(units))
	}
	for _, unit := range units {
		b, err := os.ReadFile(unit)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		loaded := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^LoadCredential=([^:\s]+):/\S+$`).FindAllStringSubmatch(text, -1) {
			loaded[m[1]] = true
		}
		exec := regexp.MustCompile(`(?s)ExecStart=(.*?[^\\])\n`).FindStringSubmatch(text)
		if exec == nil {
			t.Fatalf("%s has no ExecStart", unit)
		}
		flags := credentialFlags.FindAllStringSubmatch(exec[1], -1)
		if !strings.Contains(text, "DynamicUser=yes") || len(flags) < 3 {
			t.Errorf("%s: want DynamicUser=yes and its key files on the command line; found %d", unit, len(flags))
		}
		for _, f := range flags {
			id, ok := strings.CutPrefix(f[2], "%d/")
			if !ok || !loaded[id] {
				t.Errorf("%s: --%s %s is not a credential the unit loads (LoadCredential=%s:...)", unit, f[1], f[2], strings.TrimPrefix(f[2], "%d/"))
			}
		}
	}
}
