package console_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	rlqfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
	"github.com/quota-lease/quota-lease/internal/testenv/rlqsenvoy"
	"github.com/quota-lease/quota-lease/policy"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// consolePolicies are the demo's two and a window policy, whose shares
// count per window.
const consolePolicies = cluster.DemoPolicies + `---
name: reports
identity: [tenant]
algorithm: fixed_window
limit: 1000
period: 1m
failure: {mode: static-share, static_fraction: 0.2}
---
name: edge-api
identity: [tenant]
limit: 100
period: 1s
failure: {mode: static-share, static_fraction: 0.2}
edge: {instances: 4, no_assignment: deny}
`

// pageQuota is what the test reads off one quota's section of the page:
// the facts and each region's row, by their data-k names (data-v if the
// element has one, else its text).
type pageQuota struct {
	Quota   string              `json:"quota"`
	Facts   map[string]string   `json:"facts"`
	Regions []map[string]string `json:"regions"`
	Edge    []map[string]string `json:"edge"`
}

const readPage = `Array.from(document.querySelectorAll('section.quota')).map(function (s) {
  var kv = function (root) {
    var o = {};
    root.querySelectorAll('[data-k]').forEach(function (e) { o[e.dataset.k] = e.dataset.v !== undefined ? e.dataset.v : e.textContent.trim(); });
    return o;
  };
  return { quota: s.dataset.quota, facts: kv(s.querySelector('dl.facts')),
    regions: Array.from(s.querySelectorAll('tr[data-region]')).map(function (tr) { var o = kv(tr); o.region = tr.dataset.region; return o; }),
    edge: Array.from(s.querySelectorAll('tr[data-edge-region]')).map(function (tr) { var o = kv(tr); o.region = tr.dataset.edgeRegion; return o; }) };
})`

// A coordinator with two agents; its console, opened in headless Chromium
// through a proxy presenting an SRE's viewer certificate (as an
// authenticating proxy in front of it would), shows the admin
// API's numbers, turns a partitioned region degraded by itself within
// seconds, and marks it on the chart. The screenshot is written to
// $QUOTALEASE_CONSOLE_SCREENSHOT if set (make console-screenshot), else
// into the test's directory.
func TestConsoleInBrowser(t *testing.T) {
	testenv.SkipMultiProcess(t)
	browser := chromium(t)
	ctx := t.Context()
	c, err := cluster.Start(ctx, bins, t.TempDir(), cluster.Options{Regions: []string{"us", "eu"}, Coordinators: 1,
		// Static shares hold still, so the page and the API can be compared.
		CoordinatorArgs: []string{"--strategy", "static", "--console-sample", "250ms", "--console-refresh", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if err := c.SetPolicies(ctx, consolePolicies); err != nil {
		t.Fatal(err)
	}
	checkAuthorization(t, c, c.Coords[0].HTTP)
	front, stop, err := c.ConsoleProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	// Traffic, so the page shows demand; bounded by the test's length.
	traffic, stopTraffic := context.WithTimeout(ctx, time.Minute)
	defer stopTraffic()
	go cluster.NewDriver(c).Run(traffic, time.Minute, cluster.Load{Policy: "api-global", Attribute: "api", Identities: 1,
		Rate: func(region string, _ time.Duration) float64 { return map[string]float64{"us": 40, "eu": 20}[region] }})
	// Two Envoy-like instances stream edge-api's buckets to us's agent.
	startEdge(t, traffic, c)

	bctx := openBrowser(t, browser)
	nctx, cancel := context.WithTimeout(bctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(nctx, chromedp.Navigate(front+"/"), chromedp.WaitVisible(`tr[data-region="eu"]`)); err != nil {
		t.Fatalf("console did not show region eu: %v", err)
	}
	// Numbers: the page against the admin API, until both show active
	// leases of both regions on both quotas.
	var mismatch string
	for range 120 {
		if mismatch = compare(t, bctx, c); mismatch == "" {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if mismatch != "" {
		t.Fatalf("the page does not show the admin API's numbers: %s", mismatch)
	}

	// Let the chart gather some history, then cut eu off from the
	// coordinator: its grant lapses within one lease (2 s) and the page,
	// refreshing itself, must say degraded.
	time.Sleep(3 * time.Second)
	c.Agents[1].Partition(true)
	cut := time.Now()
	if !waitState(bctx, "api-global", "eu", "degraded", 30*time.Second) {
		t.Fatalf("the page does not show eu degraded %v after the partition: %v", time.Since(cut).Round(time.Second), pageState(bctx))
	}
	t.Logf("eu shown degraded %v after the partition", time.Since(cut).Round(100*time.Millisecond))
	// us keeps a live lease: active, or shrinking for the moment between
	// a smaller grant (eu's lapsed share is reserved, identity shares move)
	// and its acknowledgement at us's next renewal.
	if st := pageState(bctx); st["api-global/us"] != "active" && st["api-global/us"] != "shrinking" {
		t.Fatalf("us should keep its lease: %v", st)
	}
	time.Sleep(2 * time.Second) // a few samples of the degraded stretch on the chart
	bands, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('section[data-quota="api-global"] svg rect.band').length`))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`!document.getElementById('stale').hidden`))
	if err != nil {
		t.Fatal(err)
	}
	if bands == 0 {
		t.Fatal("the chart marks no degraded stretch")
	}
	if stale {
		t.Fatal("the page says it stopped updating")
	}
	saveScreenshot(t, bctx)

	c.Agents[1].Partition(false)
	if !waitState(bctx, "api-global", "eu", "active", 30*time.Second) {
		t.Fatalf("eu did not return to active on the page after the partition healed: %v", pageState(bctx))
	}
}

// chromium finds Debian's chromium, which make deps installs.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: install Debian's chromium (make deps does), or run make test")
	return ""
}

// openBrowser starts headless Chromium with the flags a closed network
// needs and a fresh profile; it is stopped when the test ends.
func openBrowser(t *testing.T, path string) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1100, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

// checkAuthorization: the console is served only to role viewer or
// admin, like the admin read API; metrics and health stay open.
func checkAuthorization(t *testing.T, c *cluster.Cluster, base string) {
	for _, tc := range []struct {
		cert, path string
		want       int
	}{
		{"", "/", http.StatusUnauthorized},
		{"service", "/", http.StatusUnauthorized}, // a certificate with no identity
		{"agent-us", "/", http.StatusForbidden},
		{"agent-us", "/policy/api-global", http.StatusForbidden},
		{"viewer", "/", http.StatusOK},
		{"admin", "/policy/api-global", http.StatusOK},
		{"viewer", "/policy/no-such", http.StatusNotFound},
		{"", "/metrics", http.StatusOK},
		{"", "/healthz", http.StatusOK},
	} {
		cfg := &tls.Config{}
		if tc.cert != "" {
			var err error
			if cfg, err = c.ClientTLS(tc.cert); err != nil {
				t.Fatal(err)
			}
		} else {
			v, _ := c.ClientTLS("viewer")
			cfg.RootCAs = v.RootCAs
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
		resp, err := hc.Get(base + tc.path)
		if err != nil {
			t.Fatalf("GET %s as %q: %v", tc.path, tc.cert, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s as %q: %d, want %d", tc.path, tc.cert, resp.StatusCode, tc.want)
		}
		hc.CloseIdleConnections()
	}
	if t.Failed() {
		t.FailNow()
	}
}

// compare reads the page and the admin API and says how they differ ("":
// not at all, with both regions active on every quota).
func compare(t *testing.T, bctx context.Context, c *cluster.Cluster) string {
	page, err := chromedp.Run(bctx, chromedp.Evaluate[[]pageQuota](readPage))
	if err != nil {
		t.Fatal(err)
	}
	var leases []*pb.LeaseRecord
	var bounds []*pb.BoundRecord
	err = c.Admin(t.Context(), func(a pb.AdminServiceClient, opts ...grpc.CallOption) error {
		lr, err := a.ListLeases(t.Context(), &pb.ListLeasesRequest{}, opts...)
		if err != nil {
			return err
		}
		br, err := a.GetBound(t.Context(), &pb.GetBoundRequest{}, opts...)
		if err != nil {
			return err
		}
		leases, bounds = lr.Leases, br.Bounds
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	byQuota := map[string]pageQuota{}
	for _, q := range page {
		byQuota[q.Quota] = q
	}
	const quotas, regions = 4, 2
	if len(page) != quotas || len(bounds) != quotas || len(leases) != quotas*regions {
		return fmt.Sprintf("page has %d quotas, API %d bounds and %d leases; want %d quotas of %d regions", len(page), len(bounds), len(leases), quotas, regions)
	}
	var diffs []string
	same := func(what, shown string, want float64) {
		got, err := strconv.ParseFloat(shown, 64)
		if err != nil || got != want {
			diffs = append(diffs, fmt.Sprintf("%s: page %q, API %v", what, shown, want))
		}
	}
	for _, b := range bounds {
		q := byQuota[b.Quota]
		same(b.Quota+" reference", q.Facts["reference"], b.Limit)
		same(b.Quota+" worst case", q.Facts["worst_case"], b.WorstCase)
		same(b.Quota+" overshoot", q.Facts["overshoot"], b.Overshoot)
	}
	for _, l := range leases {
		var row map[string]string
		for _, r := range byQuota[l.Quota].Regions {
			if r["region"] == l.Region {
				row = r
			}
		}
		what := l.Quota + "/" + l.Region
		if row == nil {
			diffs = append(diffs, what+": not on the page")
			continue
		}
		if l.State != "active" || row["state"] != l.State {
			diffs = append(diffs, fmt.Sprintf("%s state: page %q, API %q (want both active)", what, row["state"], l.State))
		}
		same(what+" share", row["share"], policy.Units(l.Rate))
		same(what+" enforcing", row["enforcing"], policy.Units(l.Enforcing))
		same(what+" reserved", row["reserved"], policy.Units(l.Reserved))
		var edge map[string]string
		for _, r := range byQuota[l.Quota].Edge {
			if r["region"] == l.Region {
				edge = r
			}
		}
		if l.Quota != "edge-api" {
			if edge != nil {
				diffs = append(diffs, what+": an edge row for a quota not served at the edge")
			}
			continue
		}
		// The edge: us's agent has both Envoy instances, three buckets;
		// eu's none. (What they report moves with every report: the page
		// must show some assigned rate, not an equal one.)
		if edge == nil {
			diffs = append(diffs, what+": no edge row on the page")
			continue
		}
		wantInstances := map[string]int32{"us": 2}[l.Region]
		same(what+" edge instances", edge["instances"], float64(l.GetEdge().GetInstances()))
		if l.GetEdge().GetInstances() != wantInstances {
			diffs = append(diffs, fmt.Sprintf("%s: the API shows %d Envoy instances, want %d", what, l.GetEdge().GetInstances(), wantInstances))
		}
		if wantInstances > 0 {
			same(what+" edge buckets", edge["buckets"], float64(l.GetEdge().GetBuckets()))
			if v, err := strconv.ParseFloat(edge["assigned"], 64); err != nil || v <= 0 {
				diffs = append(diffs, fmt.Sprintf("%s: the page shows no assigned rate (%q)", what, edge["assigned"]))
			}
		}
	}
	return strings.Join(diffs, "; ")
}

// startEdge streams edge-api's buckets to us's agent from two Envoy-like
// instances (tenants a and b, both on one, a on the other), each asking
// 20 requests/s per bucket until ctx ends.
func startEdge(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	tlsCfg, err := c.ClientTLS("service")
	if err != nil {
		t.Fatal(err)
	}
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	settings := &rlqfv3.RateLimitQuotaBucketSettings{ReportingInterval: durationpb.New(500 * time.Millisecond),
		NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior{
			NoAssignmentBehavior: &rlqfv3.RateLimitQuotaBucketSettings_NoAssignmentBehavior_FallbackRateLimit{FallbackRateLimit: deny}}}
	bucket := func(tenant string) map[string]string {
		return map[string]string{"policy": "edge-api", "tenant": tenant}
	}
	for i, tenants := range [][]string{{"a", "b"}, {"a"}} {
		cfg := rlqsenvoy.DefaultConfig()
		cfg.Name, cfg.Target, cfg.Domain, cfg.Settings, cfg.ReportInterval = fmt.Sprint("envoy-", i), c.Agents[0].Addr, "console", settings, 500*time.Millisecond
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}
		in, err := rlqsenvoy.New(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { in.Close() })
		go func() {
			tk := time.NewTicker(50 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
					for _, tn := range tenants {
						in.Allow(bucket(tn))
					}
				}
			}
		}()
	}
}

// pageState is every quota/region's mode as the page shows it.
func pageState(bctx context.Context) map[string]string {
	out := map[string]string{}
	page, err := chromedp.Run(bctx, chromedp.Evaluate[[]pageQuota](readPage))
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	for _, q := range page {
		for _, r := range q.Regions {
			out[q.Quota+"/"+r["region"]] = r["state"]
		}
	}
	return out
}

// waitState waits, without reloading, until the page shows quota/region
// in state.
func waitState(bctx context.Context, quota, region, state string, limit time.Duration) bool {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if pageState(bctx)[quota+"/"+region] == state {
			return true
		}
	}
	return false
}

func saveScreenshot(t *testing.T, bctx context.Context) {
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 600 {
		t.Fatalf("screenshot is %v", b)
	}
	path := os.Getenv("QUOTALEASE_CONSOLE_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "console.png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%v)", path, img.Bounds().Max)
}
