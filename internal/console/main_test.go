package console_test

import (
	"os"
	"testing"

	"github.com/quota-lease/quota-lease/internal/testenv"
	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
)

// bins are the coordinator and agent the browser test runs.
var bins cluster.Binaries

// Only the browser test needs the binaries: under -short it skips, and
// they are not built.
func TestMain(m *testing.M) {
	os.Exit(testenv.ShortMain(m, func() (remove func(), err error) {
		bins, remove, err = cluster.BuildTemp()
		return remove, err
	}))
}
