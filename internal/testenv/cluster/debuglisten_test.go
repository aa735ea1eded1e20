package cluster

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/testenv"
)

// With --debug-listen, the coordinator and the agent serve Go's runtime
// profiles there: a CPU profile of the seconds asked (gzipped protobuf,
// as go tool pprof reads it) and the goroutines, named after the code;
// the agent's check listener serves none.
func TestDebugListenerServesProfiles(t *testing.T) {
	testenv.SkipMultiProcess(t)
	agentAddr, coordAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	c := startWith(t, globalPolicy, Options{Regions: []string{"us"}, Coordinators: 1,
		AgentArgs: []string{"--debug-listen", agentAddr}, CoordinatorArgs: []string{"--debug-listen", coordAddr}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	get := func(url string) []byte {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v: %.200s", url, resp.StatusCode, err, body)
		}
		return body
	}
	for name, addr := range map[string]string{"agent": agentAddr, "coordinator": coordAddr} {
		if prof := get("http://" + addr + "/debug/pprof/profile?seconds=1"); !bytes.HasPrefix(prof, []byte{0x1f, 0x8b}) {
			t.Errorf("%s: the CPU profile is not gzipped (%d bytes)", name, len(prof))
		}
		if g := string(get("http://" + addr + "/debug/pprof/goroutine?debug=1")); !strings.Contains(g, "quota-lease") {
			t.Errorf("%s: no goroutine of quota-lease's code in the dump: %.300s", name, g)
		}
	}
	resp, err := c.Agents[0].web.Get(c.Agents[0].HTTP + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Error("the agent's check listener serves /debug/pprof/ too: profiles belong on --debug-listen only")
	}
}
