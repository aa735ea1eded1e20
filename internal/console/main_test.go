package console_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/quota-lease/quota-lease/internal/cluster"
)

// bins are the coordinator and agent the browser test runs.
var bins cluster.Binaries

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quota-lease-bin-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	bins, err = cluster.Build(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
