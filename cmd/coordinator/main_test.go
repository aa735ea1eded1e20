package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/leaseapi"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestQuotaValidate(t *testing.T) {
	code, out, errs := runCmd(t, "quota", "validate", "-f", "../../examples/policies.yaml")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"api-per-tenant", "login-per-ip", "sliding_log", "static-share"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if code, out, _ := runCmd(t, "quota", "validate", "-f", "../../examples/policies.yaml", "-o", "json"); code != 0 || !strings.HasPrefix(out, "[") {
		t.Fatalf("json: exit %d: %s", code, out)
	}
	sharded := filepath.Join(t.TempDir(), "sharded.yaml")
	if err := os.WriteFile(sharded, []byte("name: hot\nidentity: [route]\nlimit: 20000\nperiod: 1s\nshards: 8\n---\nname: calm\nidentity: [tenant]\nlimit: 5\nperiod: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCmd(t, "quota", "validate", "-f", sharded)
	if lines := strings.Split(out, "\n"); code != 0 || len(lines) < 3 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "SHARDS") ||
		!strings.HasSuffix(strings.TrimSpace(lines[1]), " 8") || !strings.HasSuffix(strings.TrimSpace(lines[2]), " 1") {
		t.Fatalf("sharded policies: exit %d %s:\n%s", code, errs, out)
	}
}

func TestUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: x\nidentity: [tenant]\nlimit: .nan\nperiod: 1s\n"), 0o644)
	cases := []struct {
		args []string
		code int
		text string
	}{
		{[]string{"quota", "validate", "-f", bad}, 1, `field "limit"`},
		{[]string{"quota", "validate", "-f", "/does/not/exist"}, 1, "no such file"},
		{[]string{"quota", "validate"}, 2, "Usage"},
		{[]string{"quota", "validate", "-f", bad, "-o", "xml"}, 2, "Usage"},
		{[]string{"nonsense"}, 2, "unknown command"},
		{nil, 2, "Commands:"},
		{[]string{"rebalance", "--now", "--pause"}, 2, "Usage"},
		{[]string{"regions", "set-weight", "us"}, 2, "Usage"},
		{[]string{"serve", "--etcd", "cloud"}, 1, "embedded or external"},
		{[]string{"serve", "--listen", "0.0.0.0:0"}, 1, "pass --insecure"},
		{[]string{"serve", "--log-level", "bogus"}, 1, "use trace, debug"},
		{[]string{"serve", "--etcd-listen", "0.0.0.0:0"}, 1, "--etcd-listen"},
		{[]string{"serve", "--ratelimit-xds", "10.0.0.1:18001"}, 1, "without TLS whoever answers there sets the limits"},
		{[]string{"serve", "--ratelimit-xds", "envoy-gateway"}, 1, "want host:port"},
		{[]string{"serve", "--ratelimit-xds", "envoy-gateway:18001", "--ratelimit-xds-tls-cert", "c.pem"}, 1, "--ratelimit-xds TLS"},
		{[]string{"serve", "--ratelimit-xds", "127.0.0.1:18001", "--ratelimit-xds-node-id", ""}, 1, "node id is empty"},
		{[]string{"serve", "--ratelimit-xds", "127.0.0.1:18001", "--ratelimit-xds-server-id", "spiffe://qd/role/xds"}, 1, "needs TLS"},
		{[]string{"leases", "--coordinator", "127.0.0.1:1", "--timeout", "300ms"}, 1, "coordinator 127.0.0.1:1"},
	}
	for _, c := range cases {
		code, _, errs := runCmd(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.text) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errs, c.code, c.text)
		}
	}
}

// The serve command with embedded etcd, driven by the admin commands as an
// SRE would, then shut down gracefully.
func TestServeAndAdminCommands(t *testing.T) {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	httpAddr := hl.Addr().String()
	hl.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var serveErr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", addr, "--data-dir", t.TempDir(), "--regions", "us,eu,ap",
			"--session-ttl", "2s", "--lease-duration", "2s", "--log-level", "warn", "--http-listen", httpAddr}, &bytes.Buffer{}, &serveErr)
	}()
	c := "--coordinator=" + addr
	edgeFile := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(edgeFile, []byte(edgePolicies), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, _, _ := runCmd(t, "regions", "list", c); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator did not come up: %s", serveErr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	steps := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"quota", "set", "-f", "../../examples/policies.yaml", c}, 0, "stored policy api-per-tenant"},
		{[]string{"quota", "list", c}, 0, "search-per-user-route"},
		{[]string{"quota", "get", "api-per-tenant", c}, 0, "static_fraction: 0.2"},
		{[]string{"quota", "get", "nope", c}, 1, "no policy"},
		{[]string{"quota", "get", strings.Repeat("n", 10000), c}, 1, `no policy "nnnnnnnn`},
		{[]string{"quota", "delete", strings.Repeat("n", 10000), c}, 1, "n\"... (10000 bytes)"},
		{[]string{"regions", "list", c}, 0, "ap"},
		{[]string{"regions", "set-weight", "sa", "2", c}, 0, "region sa has weight 2"},
		{[]string{"regions", "set-weight", "Bad Name", "2", c}, 1, "region name"},
		{[]string{"leases", c}, 0, "QUOTA"},
		{[]string{"leases", "--region", "mars", c}, 1, "unknown region"},
		{[]string{"leases", "--identities", c}, 0, "no identity holds shares of its own"},
		{[]string{"rebalance", "--pause", c}, 0, "paused"},
		{[]string{"rebalance", "--resume", "-o", "json", c}, 0, `false`},
		{[]string{"release", "us", c}, 0, "released 0"},
		{[]string{"quota", "delete", "login-per-ip", c}, 0, "deleted"},
		{[]string{"quota", "list", "-o", "json", c}, 0, "api-per-tenant"},
		{[]string{"bound", c}, 0, "fallback="},
		{[]string{"bound", c}, 0, "REFERENCE: the most one ideal global limiter admits"},
		{[]string{"bound", "nope", c}, 1, "no policy"},
		{[]string{"quota", "set", "-f", edgeFile, c}, 0, "stored policy edge-open"},
		// 4 regions (us, eu, ap, sa) × 4 instances × ((1 + 1 start) × 3 tokens + 2/s × 1s) × cost 1
		{[]string{"bound", "edge-bucket", c}, 0, "edge=128 "},
		{[]string{"bound", "edge-deny", c}, 0, "edge=0 "},
		{[]string{"bound", "edge-open", c}, 0, "edge=+Inf"},
		{[]string{"bound", "edge-open", "-o", "json", c}, 0, `"edge": null`},
	}
	for _, s := range steps {
		code, out, errs := runCmd(t, s.args...)
		if code != s.code || !strings.Contains(out+errs, s.want) {
			t.Errorf("%v: exit %d\nstdout: %s\nstderr: %s\nwant exit %d and %q", s.args, code, out, errs, s.code, s.want)
		}
	}
	checkJSONStyle(t, c)
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"quotalease_coordinator_leader 1", `quotalease_coordinator_booked_ratio{quota="api-per-tenant"}`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d: %s", code, serveErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not shut down within 20s")
	}
}

// edgePolicies are policies served at the edge, one per kind of edge
// term: none (Envoy denies), a token bucket's and none at all (Envoy
// allows).
const edgePolicies = `name: edge-deny
identity: [tenant]
limit: 10
period: 1s
edge: {instances: 4, no_assignment: deny}
---
name: edge-bucket
identity: [tenant]
limit: 10
period: 1s
edge: {instances: 4, no_assignment: deny, expired: {rule: token_bucket, max_tokens: 3, tokens_per_second: 2, timeout: 10s}}
---
name: edge-open
identity: [tenant]
limit: 10
period: 1s
edge: {instances: 4, no_assignment: allow}
`

// checkJSONStyle runs every command with -o json and checks the one style
// (docs/cli.md): it parses, every key is snake_case (map keys, which are
// data such as term or region names, aside), no number is a string, and
// policies are objects.
func checkJSONStyle(t *testing.T, c string) {
	t.Helper()
	// A lease to list, in units: region us renews api-per-tenant (50/s).
	cl, err := leaseapi.NewClient([]string{strings.TrimPrefix(c, "--coordinator=")})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Its agent reports an edge: 3 Envoy instances with 7 buckets,
	// assigned 12.5/s, asking 80/s; ap's agent reports none.
	if _, err := cl.Lease(t.Context(), &pb.LeaseRequest{Region: "us", Instance: "us-1", Nonce: "n1",
		Quotas: []*pb.QuotaRequest{{Quota: "api-per-tenant", Seq: 1, Demand: 10 * policy.Micro,
			Edge: &pb.EdgeSummary{Instances: 3, LibraryInstances: 1, Buckets: 7, Assigned: 12_500_000, Usage: 80 * policy.Micro}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Lease(t.Context(), &pb.LeaseRequest{Region: "ap", Instance: "ap-1", Nonce: "n1",
		Quotas: []*pb.QuotaRequest{{Quota: "api-per-tenant", Seq: 1, Demand: 10 * policy.Micro}}}); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCmd(t, "leases", "-o", "json", c)
	if code != 0 || !strings.Contains(out, `"limit": 50,`) {
		t.Errorf("leases -o json: the limit is not 50 units:\n%s", out)
	}
	var leases struct {
		Leases []struct {
			Region string
			Edge   map[string]float64
		}
	}
	if err := json.Unmarshal([]byte(out), &leases); err != nil {
		t.Fatal(err)
	}
	edges := map[string]map[string]float64{}
	for _, l := range leases.Leases {
		edges[l.Region] = l.Edge
	}
	if e := edges["us"]; e["instances"] != 3 || e["library_instances"] != 1 || e["buckets"] != 7 || e["assigned"] != 12.5 || e["usage"] != 80 || e["agents"] != 1 {
		t.Errorf("leases -o json: us's edge is %v, want 3 instances (1 the library's), 7 buckets, assigned 12.5, usage 80 (units), 1 agent:\n%s", e, out)
	}
	if e := edges["ap"]; e["instances"] != 0 || e["agents"] != 0 {
		t.Errorf("leases -o json: ap, without an edge, shows %v", e)
	}
	code, out, _ = runCmd(t, "leases", c)
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "api-per-tenant" {
			rows[f[1]] = f
		}
	}
	us, ap := rows["us"], rows["ap"]
	if code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "ENVOYS BUCKETS ASSIGNED USAGE") || len(us) < 7 ||
		strings.Join(us[len(us)-7:], " ") != "3 (1 library) 7 12.5 (25%) 80" || len(ap) < 4 || strings.Join(ap[len(ap)-4:], " ") != "- - - -" {
		t.Errorf("leases: the edge columns are not 3 (1 library) 7 12.5 (25%%) 80 for us and - for ap:\n%s", out)
	}
	for _, args := range [][]string{
		{"quota", "list"}, {"quota", "get", "api-per-tenant"}, {"quota", "validate", "-f", "../../examples/policies.yaml"},
		{"quota", "set", "-f", "../../examples/policies.yaml"}, {"leases"}, {"regions", "list"},
		{"regions", "set-weight", "sa", "1"}, {"rebalance", "--now"}, {"release", "eu"}, {"bound"},
	} {
		full := append(append([]string{}, args...), "-o", "json")
		if len(args) < 2 || args[1] != "validate" {
			full = append(full, c)
		}
		code, out, errs := runCmd(t, full...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", full, code, errs)
			continue
		}
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("%v: not JSON: %v\n%s", full, err, out)
			continue
		}
		for _, bad := range jsonStyleErrors(v, "", false) {
			t.Errorf("%v: %s\n%s", full, bad, out)
		}
		if len(args) > 1 && args[0] == "quota" && args[1] == "list" && !strings.Contains(out, `"policy": {`) {
			t.Errorf("quota list -o json: policies are not objects:\n%s", out)
		}
	}
}

var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
var numberLike = regexp.MustCompile(`^-?[0-9]+$`) // an int64 as protojson writes it

// jsonStyleErrors lists what in v breaks the style; dataKeys marks a map
// whose keys are data (a policy's floors, a bound's terms).
func jsonStyleErrors(v any, path string, dataKeys bool) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !dataKeys && !snakeKey.MatchString(k) {
				out = append(out, fmt.Sprintf("key %s%s is not snake_case", path, k))
			}
			out = append(out, jsonStyleErrors(e, path+k+".", k == "terms" || k == "floors")...)
		}
	case []any:
		for _, e := range x {
			out = append(out, jsonStyleErrors(e, path+"[].", false)...)
		}
	case string:
		if numberLike.MatchString(x) {
			out = append(out, fmt.Sprintf("%s is the number %q as a string", strings.TrimSuffix(path, "."), x))
		}
	}
	return out
}
