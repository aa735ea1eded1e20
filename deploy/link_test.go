package deploy

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The shipped binaries link none of the test and demo scaffolding
// (internal/testenv: the multi-process harness, real Redis servers, fault
// proxies); the demo is its own command, quota-lease-demo. Checked on the
// built binaries' symbols: what the linker kept, not only what is imported.
func TestShippedBinariesLinkNoTestScaffolding(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries; skipped with -short")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build with")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, cmd := range []string{"coordinator", "regional-agent"} {
		bin := filepath.Join(dir, cmd)
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "../cmd/"+cmd)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", cmd, err, out)
		}
		out, err := exec.CommandContext(ctx, "go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatalf("go tool nm %s: %v", cmd, err)
		}
		syms := string(out)
		if !strings.Contains(syms, "quota-lease/internal/version.") {
			t.Fatalf("go tool nm %s lists no quota-lease symbol: cannot tell what it links", cmd)
		}
		var bad []string
		for _, line := range strings.Split(syms, "\n") {
			if strings.Contains(line, "quota-lease/internal/testenv") {
				bad = append(bad, strings.TrimSpace(line))
			}
		}
		if len(bad) > 0 {
			if len(bad) > 5 {
				bad = append(bad[:5], "...")
			}
			t.Errorf("%s links the test scaffolding (%d symbols), e.g.\n\t%s", cmd, len(bad), strings.Join(bad, "\n\t"))
		}
	}
}

// The shipped commands do not import the test and demo scaffolding, even
// blank (which links no symbol the test above would see). Fast: go list.
func TestShippedCommandsImportNoTestScaffolding(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list packages with")
	}
	for _, cmd := range []string{"coordinator", "regional-agent"} {
		out, err := exec.Command("go", "list", "-deps", "../cmd/"+cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps ./cmd/%s: %v", cmd, err)
		}
		for _, pkg := range strings.Fields(string(out)) {
			if strings.Contains(pkg, "quota-lease/internal/testenv") {
				t.Errorf("./cmd/%s imports %s, test scaffolding", cmd, pkg)
			}
		}
	}
}

// The pure logic (policy, lease, allocation, bound, admission, clock,
// edge, edge/tokens, edge/envoy, scale) links no I/O library: no network, no Redis, no etcd, no gRPC, no
// processes. Its decisions can be tested and simulated without any.
func TestPureLogicLinksNoIO(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list packages with")
	}
	pure := []string{"policy", "lease", "allocation", "bound", "admission", "clock", "edge", "edge/tokens", "edge/envoy", "scale"}
	args := []string{"list", "-deps"}
	for _, p := range pure {
		args = append(args, "../"+p)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, io := range []string{"net", "os/exec", "redis", "etcd", "grpc", "prometheus", "hclog"} {
			if pkg == io || strings.HasPrefix(pkg, io+"/") || strings.Contains(pkg, "/"+io) {
				t.Errorf("the pure packages %v import %s", pure, pkg)
			}
		}
	}
}

// The client library a Go service links stays small: the pure decision
// logic and gRPC, no store, no coordinator, no agent, no metrics registry.
func TestLibraryLinksNoDaemon(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to list packages with")
	}
	out, err := exec.Command("go", "list", "-deps", "../quotalease").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, not := range []string{"redis", "etcd", "prometheus", "hclog", "internal/agent", "internal/coordinator", "internal/testenv"} {
			if strings.Contains(pkg, not) {
				t.Errorf("package quotalease imports %s", pkg)
			}
		}
	}
}
