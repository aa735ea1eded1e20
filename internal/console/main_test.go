package console_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/quota-lease/quota-lease/internal/testenv/cluster"
)

// bins are the coordinator and agent the browser test runs.
var bins cluster.Binaries

func TestMain(m *testing.M) {
	var remove func()
	var err error
	if bins, remove, err = cluster.BuildTemp(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	remove()
	os.Exit(code)
}
